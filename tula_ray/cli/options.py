"""The options the `tula-ray` commands share, and the names of what they write."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path
from typing import Any

from tula_ray.planning.accuracy import REFERENCE_BATCH_DEFAULT
from tula_ray.planning.context import OBJECTIVE_DEFAULT, PRICING_DEFAULT
from tula_ray.planning.plan import FORMER_NAMES_REMOVED_IN
from tula_ray.planning.policy import OBJECTIVES
from tula_ray.planning.search_strategies import SEARCH_STRATEGIES, SEARCH_STRATEGY_DEFAULT
from tula_ray.precision import PRECISIONS

METRICS_FILE = "train_metrics.csv"
# tula_ray.training.strategies.TRAINING_STRATEGY_DEFAULT, repeated: importing it would
# import torch at start-up (tests/test_cli.py holds the two equal).
STRATEGY_DEFAULT = "ags-ns"
TUNED_FILE = "tuned.json"  # `tula-ray tune`'s best configuration: `tula-ray train --config`
# `tula-ray replay` of profiles that carry no epochs or dataset size (a CSV, --synthetic).
REPLAY_EPOCHS_DEFAULT = 20
REPLAY_DATASET_SIZE_DEFAULT = 60_000
SHOWN_COLUMNS = ("epoch", "resumed_from", "train_loss", "train_accuracy", "val_accuracy",
                 "test_loss", "test_accuracy", "lr", "seconds", "scaled_fraction", "progress")


class FormerSpelling(argparse.Action):
    """An option's former spelling: it stores its value where the option's own spelling
    does (`dest`), with a FutureWarning that names that spelling and the removal version."""

    def __init__(self, *args: Any, spelling: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spelling = spelling

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        warnings.warn(f"{option_string} is deprecated and will be removed in tula-ray "
                      f"{FORMER_NAMES_REMOVED_IN}: use {self.spelling}", FutureWarning)
        setattr(namespace, self.dest, values)


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--search-strategy", dest="search_strategy",
                        choices=sorted(SEARCH_STRATEGIES), default=SEARCH_STRATEGY_DEFAULT,
                        help="which candidates to profile and fit from: the extremes "
                             "(partial, the default), all (full), or the extremes and then "
                             "the choice and its contenders (adaptive)")
    parser.add_argument("--mode", dest="search_strategy", choices=sorted(SEARCH_STRATEGIES),
                        default=argparse.SUPPRESS, action=FormerSpelling,
                        spelling="--search-strategy",
                        help="the former name of --search-strategy (deprecated, removed in "
                             f"tula-ray {FORMER_NAMES_REMOVED_IN})")
    parser.add_argument("--objective", choices=OBJECTIVES, default=OBJECTIVE_DEFAULT,
                        help="what the choice minimises: training time or cost of the "
                             "plan's epochs (time, cost, knee, weighted), or to the "
                             "accuracy those epochs reach at --reference-batch "
                             "(time_to_accuracy, cost_to_accuracy, knee_to_accuracy)")
    parser.add_argument("--reference-batch", type=int, default=REFERENCE_BATCH_DEFAULT,
                        help="M0: the global batch at which the plan's epochs reach the "
                             "target accuracy (default %(default)s)")
    parser.add_argument("--noise-scale", type=float, default=None,
                        help="the gradient noise scale at the target accuracy, if you "
                             "measured it on a model trained to it "
                             "(tula_ray.measure_noise_scale); default: the profiles' "
                             "(a barely trained model's)")
    parser.add_argument("--pricing", default=PRICING_DEFAULT,
                        help="fixed[:USD_PER_NODE_HOUR] or memory[:USD_PER_GB_HOUR]; a "
                             "node is billed whole (ceil(N / G) nodes for N workers on "
                             "nodes of G), ':shared' last when nodes are shared with other "
                             "jobs (fixed:12.24:shared: N / G of a node)")
    parser.add_argument("--out", type=Path, default=Path("plan"),
                        help="directory for plan.json and the PNG figures")


def storage_location(value: str) -> str:
    """`--storage-path`: a cloud URI (s3://..., gs://...) as given, a local path made absolute."""
    return value if "://" in value else str(Path(value).resolve())


def runtime_env_json(value: str) -> dict[str, Any]:
    """`--runtime-env-json`: a JSON object, as Ray's own CLI takes it."""
    try:
        runtime_env = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {value!r}") from exc
    if not isinstance(runtime_env, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, e.g. "
                                         f'\'{{"env_vars": {{"NCCL_DEBUG": "INFO"}}}}\', not {value!r}')
    return runtime_env


def add_address_option(parser: argparse.ArgumentParser) -> None:
    """`--address`: the Ray cluster to run on (tula_ray.cluster.ensure_ray), and
    `--runtime-env-json`: the Ray runtime environment of the job."""
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join: host:port, or 'auto' for the cluster this "
                             "machine belongs to (e.g. on the head of `ray up`); default "
                             "$RAY_ADDRESS, else a new local Ray on loopback")
    parser.add_argument("--runtime-env-json", dest="runtime_env", type=runtime_env_json,
                        default=None,
                        help="the Ray runtime environment every trial and worker inherits, as "
                             "JSON (as Ray's CLI takes it), e.g. '{\"py_modules\": "
                             "[\"my_models\"], \"env_vars\": {\"NCCL_DEBUG\": \"INFO\"}}'")


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by `train` and `demo --train`."""
    parser.add_argument("--strategy", default=STRATEGY_DEFAULT,
                        help=f"{STRATEGY_DEFAULT} (default: AGS-NS, README), ags (the paper's "
                             "literal AGS) or a baseline: lbt, lrs, lars, polo "
                             "(tula_ray.training.strategies.TRAINING_STRATEGIES)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs to train (default: the plan's; under an objective to an "
                             "accuracy, its choice's epochs to target)")
    # tula_ray.training.budget.BUDGETS, repeated as STRATEGY_DEFAULT is (tests/test_cli.py)
    parser.add_argument("--budget", choices=("epochs", "scale-invariant"), default="epochs",
                        help="epochs: train --epochs; scale-invariant: train until AGS-NS's "
                             "AdaScale progress reaches --epochs at its reference batch "
                             "(tula_ray.training.budget)")
    parser.add_argument("--target-accuracy", type=float, default=None,
                        help="train until the accuracy on a validation split reaches this "
                             "(e.g. 0.9), then stop; --epochs is then the most it trains")
    parser.add_argument("--eval-every-samples", type=int, default=None,
                        help="with --target-accuracy: training samples between two "
                             "evaluations of the validation split (default: a quarter epoch); "
                             "with --batch adaptive, between two choices of B")
    # tula_ray.runs.adaptive_batch.BATCH_MODES, repeated as --budget's are
    parser.add_argument("--batch", choices=("fixed", "adaptive"), default=None,
                        help="fixed: the plan's B throughout; adaptive: B chosen again as the "
                             "noise scale grows, among the plan's candidates at its N "
                             "(default: what the plan chose)")
    parser.add_argument("--validation-fraction", type=float, default=None,
                        help="with --target-accuracy: the share of the training set held out "
                             "as the validation split (default 0.1; never the test set)")
    add_precision_option(parser, "default: the plan's, else the workload's, fp32")
    parser.add_argument("--max-failures", type=int, default=None,
                        help="restarts from the last checkpoint after a worker failure "
                             "(default: tula_ray.train's)")
    parser.add_argument("--keep-checkpoints", type=int, default=None,
                        help="the last k epochs' checkpoints kept in storage (default: "
                             "tula_ray.train's, 2)")
    parser.add_argument("--collective-timeout-s", type=float, default=None,
                        help="seconds an all-reduce waits for a peer before the job fails and "
                             "restarts (default: tula_ray.train's, 600)")


def add_precision_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help=f"what a training step computes in ({default}; "
                             "tula_ray.precision)")


def add_job_options(parser: argparse.ArgumentParser, storage_help: str, out: Path,
                     written: str) -> None:
    """What `train` and `tune` share: the workload, the Ray storage, the output directory."""
    parser.add_argument("--workload", default=None,
                        help="a built-in workload name, when the plan records none")
    parser.add_argument("--storage-path", type=storage_location, default=None,
                        help=f"{storage_help} (default ~/ray_results)")
    parser.add_argument("--out", type=Path, default=out, help=f"directory for {written}")


def add_import_option(parser: argparse.ArgumentParser) -> None:
    """`--import`: the user's extension modules (tula_ray.cli.extensions)."""
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MODULE_OR_FILE",
                        help="import a module (a dotted name, from the working directory "
                             "too) or a .py file first: the search strategies, training "
                             "strategies, pricings, compute forms and workloads it registers "
                             "are then known to the command; repeatable")
