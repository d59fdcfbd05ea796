"""The `tula-ray` command.

    tula-ray demo                 a real search on local Ray with the built-in workload
    tula-ray search CONFIG.yaml   a search described in a file (keys = tula_ray.search arguments)
    tula-ray replay PROFILES      re-fit and re-plan offline from recorded profiles (CSV or plan.json)
    tula-ray train PLAN.json      train the plan's chosen N and B as a Ray Train job (AGS by default)
    tula-ray tune PLAN.json       tune a strategy at the plan's N and B (Optuna + ASHA on Ray Tune)
    tula-ray demo --train         search, then train the choice

Ray and torch are imported only when a command runs, so `tula-ray --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from tula_ray.failures import UserCodeError
from tula_ray.planning.plan import UNTRAINABLE, Plan, build_plan
from tula_ray.planning.policy import OBJECTIVES
from tula_ray.planning.search_strategies import SEARCH_STRATEGIES
from tula_ray.space import SearchSpace

METRICS_FILE = "train_metrics.csv"
# tula_ray.training.strategies.TRAINING_STRATEGY_DEFAULT, repeated: importing it would
# import torch at start-up (tests/test_cli.py holds the two equal).
STRATEGY_DEFAULT = "ags-ns"
TUNED_FILE = "tuned.json"  # `tula-ray tune`'s best configuration: `tula-ray train --config`
SHOWN_COLUMNS = ("epoch", "resumed_from", "train_loss", "train_accuracy", "test_loss",
                 "test_accuracy", "lr", "seconds", "scaled_fraction")


def _add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--search-strategy", "--mode", dest="search_strategy",
                        choices=sorted(SEARCH_STRATEGIES), default="partial",
                        help="which candidates to profile and fit from: the extremes "
                             "(partial, the default), all (full), or the extremes and then "
                             "the choice and its contenders (adaptive); --mode is the former "
                             "name")
    parser.add_argument("--objective", choices=OBJECTIVES, default="knee")
    parser.add_argument("--pricing", default="fixed",
                        help="fixed[:USD_PER_NODE_HOUR] or memory[:USD_PER_GB_HOUR]")
    parser.add_argument("--out", type=Path, default=Path("plan"),
                        help="directory for plan.json and the PNG figures")


def _write(plan: Plan, out: Path) -> None:
    print(plan.summary())
    plan.to_json(out / "plan.json")
    figures = plan.plot(out)
    print(f"wrote {out / 'plan.json'} and {', '.join(str(f) for f in figures)}")


def storage_location(value: str) -> str:
    """`--storage-path`: a cloud URI (s3://..., gs://...) as given, a local path made absolute."""
    return value if "://" in value else str(Path(value).resolve())


def runtime_env_json(value: str) -> dict[str, Any]:
    """`--runtime-env-json`: a JSON object, as Ray's own CLI takes it."""
    import json

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
                        help="epochs to train (default: the plan's)")
    parser.add_argument("--max-failures", type=int, default=None,
                        help="restarts from the last checkpoint after a worker failure "
                             "(default: tula_ray.train's)")


def _add_job_options(parser: argparse.ArgumentParser, storage_help: str, out: Path,
                     written: str) -> None:
    """What `train` and `tune` share: the workload, the Ray storage, the output directory."""
    parser.add_argument("--workload", default=None,
                        help="a built-in workload name, when the plan records none")
    parser.add_argument("--storage-path", type=storage_location, default=None,
                        help=f"{storage_help} (default ~/ray_results)")
    parser.add_argument("--out", type=Path, default=out, help=f"directory for {written}")


def add_train_command(commands: Any) -> None:
    """The `train` subcommand on the `tula-ray` subparsers."""
    parser = commands.add_parser("train", help="train a plan's chosen N and B as a Ray Train job")
    parser.add_argument("plan", type=Path, help="a plan.json written by demo, search or replay")
    add_train_options(parser)
    _add_job_options(parser, "where Ray Train keeps checkpoints", Path("train"), METRICS_FILE)
    parser.add_argument("--config", type=Path, default=None,
                        help=f"a {TUNED_FILE} written by `tula-ray tune` (strategy, lr, options)")
    add_address_option(parser)
    parser.set_defaults(run=run_train)


def add_tune_command(commands: Any) -> None:
    """The `tune` subcommand: tula_ray.tune_training, best configuration to --out/tuned.json."""
    parser = commands.add_parser("tune", help="tune a strategy at a plan's N and B "
                                              "(Optuna + ASHA, judged on held-out training data)")
    parser.add_argument("plan", type=Path, help="a plan.json written by demo, search or replay")
    parser.add_argument("--strategy", default=STRATEGY_DEFAULT,
                        help=f"the strategy to tune (default {STRATEGY_DEFAULT})")
    parser.add_argument("--trials", type=int, default=None,
                        help="sampled configurations (default: tula_ray.tune_training's)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per trial")
    _add_job_options(parser, "where Ray Tune keeps the trials", Path("tune"), TUNED_FILE)
    add_address_option(parser)
    parser.set_defaults(run=run_tune)


def run_tune(args: argparse.Namespace) -> None:
    """`tula-ray tune`: the plan file must exist before Ray is started."""
    import json

    if not args.plan.is_file():
        raise FileNotFoundError(f"plan file {args.plan} does not exist; write one with "
                                "`tula-ray demo` or `tula-ray replay`")
    from tula_ray.runs.tune_training import tune_training  # imports ray

    trials = {} if args.trials is None else {"trials": args.trials}
    best = tune_training(args.plan, args.strategy, epochs=args.epochs, workload=args.workload,
                         storage_path=args.storage_path, address=args.address,
                         runtime_env=args.runtime_env, **trials)
    print(f"best of {len(best.trials)} trials: validation accuracy {best.val_accuracy:.4f} "
          f"with {best.config}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / TUNED_FILE).write_text(json.dumps(best.config, indent=1))
    print(f"wrote {args.out / TUNED_FILE}; train it with "
          f"`tula-ray train {args.plan} --config {args.out / TUNED_FILE}`")


def run_train(args: argparse.Namespace) -> None:
    """`tula-ray train`: the plan file must exist before Ray is started."""
    if not args.plan.is_file():
        raise FileNotFoundError(f"plan file {args.plan} does not exist; write one with "
                                "`tula-ray demo` or `tula-ray replay`")
    train_and_write(args.plan, args, workload=args.workload)


def train_and_write(plan: Any, args: argparse.Namespace, workload: str | None = None) -> None:
    """Train `plan` (a Plan or a path), print the per-epoch table, write the metrics CSV."""
    from tula_ray.runs.train import train  # imports ray

    storage = args.storage_path
    retries = {} if args.max_failures is None else {"max_failures": args.max_failures}
    tuned = _tuned_config(getattr(args, "config", None)) or {"strategy": args.strategy}
    result = train(plan, workload=workload, epochs=args.epochs, storage_path=storage,
                   address=args.address, runtime_env=args.runtime_env, **tuned, **retries)
    shown = [c for c in SHOWN_COLUMNS if c in result.metrics.columns]
    print(f"trained N={result.num_workers}, B={result.global_batch} with {result.strategy}:")
    print(result.metrics[shown].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    args.out.mkdir(parents=True, exist_ok=True)
    result.metrics.to_csv(args.out / METRICS_FILE, index=False)
    print(f"wrote {args.out / METRICS_FILE}; last checkpoint {result.checkpoint_path}")


def _tuned_config(path: Path | None) -> dict[str, Any] | None:
    """The train() keywords a `tula-ray tune` run wrote (strategy, lr, strategy_options)."""
    import json

    if path is None:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; write one with "
                                "`tula-ray tune`")
    config = json.loads(path.read_text())
    if not isinstance(config, dict) or set(config) - {"strategy", "lr", "strategy_options"}:
        raise ValueError(f"{path}: expected the keys strategy, lr, strategy_options that "
                         f"`tula-ray tune` writes, got {sorted(config) if isinstance(config, dict) else config!r}")
    return config


@contextlib.contextmanager
def _ray_for(enabled: bool, address: str | None,
             runtime_env: dict[str, Any] | None) -> Iterator[None]:
    """One Ray for several steps (demo: search then train) instead of one each."""
    if not enabled:
        yield
        return
    from tula_ray.cluster import ray_session  # imports ray

    with ray_session(address, runtime_env):
        yield


def _replay(args: argparse.Namespace) -> None:
    meta: dict = {"source": "replay"}
    untrainable: dict = {}
    if args.synthetic:
        from tula_ray.planning.synthetic import example_params, synthetic_profiles

        space = SearchSpace.build((1, 2), min_batch=32, max_batch=2048)
        profiles = synthetic_profiles(space.candidates(), example_params(), seed=args.seed)
        workload, epochs, dataset_size = "synthetic", args.epochs, args.dataset_size
    elif args.profiles is None:
        raise SystemExit("replay needs PROFILES (a CSV of profile rows or a plan.json) "
                         "or --synthetic")
    elif args.profiles.suffix == ".json":
        old = Plan.from_json(args.profiles)
        profiles, workload = old.profiles, old.workload
        epochs, dataset_size = old.epochs, old.dataset_size
        for key in ("training_strategy", "training_options"):
            meta[key] = old.meta.get(key)
        space = SearchSpace.of_pairs(old.table["num_workers"], old.table["global_batch"])
        if "trainable" in old.table:  # what the plan's training strategy cannot train
            refused = old.table[~old.table["trainable"].astype(bool)]
            untrainable = {(int(n), int(b)): reason.removeprefix(UNTRAINABLE) for n, b, reason
                           in zip(refused["num_workers"], refused["global_batch"],
                                  refused["infeasible_reason"])}
    else:
        profiles = pd.read_csv(args.profiles, keep_default_na=False, na_values=[""])
        workload, epochs, dataset_size = args.profiles.stem, args.epochs, args.dataset_size
        space = SearchSpace.of_pairs(profiles["num_workers"], profiles["global_batch"])
    plan = build_plan(space, profiles, epochs=epochs, dataset_size=dataset_size,
                      strategy=args.search_strategy, objective=args.objective,
                      pricing=args.pricing,
                      workload=workload, meta=meta, untrainable=untrainable)
    _write(plan, args.out)


def _demo(args: argparse.Namespace) -> None:
    from tula_ray.workloads.fashion_mnist_files import locate

    # Before Ray and torch: a machine with no means to get the data stops in seconds.
    print(f"Fashion-MNIST: {locate().source}", flush=True)
    from tula_ray.runs.search import search  # imports ray: only for the commands that run it

    # With --train, one Ray for the search and the training.
    with _ray_for(args.train, args.address, args.runtime_env):
        plan = search("fashion-mnist-cnn", cluster_sizes=tuple(args.cluster_sizes),
                      min_batch=args.min_batch, max_batch=args.max_batch,
                      strategy=args.search_strategy, objective=args.objective,
                      pricing=args.pricing, address=args.address,
                      storage_path=args.storage_path, training_strategy=args.strategy,
                      runtime_env=args.runtime_env)
        _write(plan, args.out)
        meta = plan.meta
        print(f"memory probe {meta['probe_wall_s']:.0f} s, profiling "
              f"{meta['profiling_wall_s']:.0f} s: {meta['candidates_profiled']} candidates in "
              f"{meta['launches']} worker-group launches, {meta['rounds']} rounds "
              f"({meta['stop_reason']})")
        if args.train:
            train_and_write(plan, args)


def _search_file(args: argparse.Namespace) -> None:
    import inspect

    import yaml

    from tula_ray.runs.search import search

    config = yaml.safe_load(args.config.read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{args.config}: expected a mapping of tula_ray.search() arguments")
    allowed = set(inspect.signature(search).parameters)
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(f"{args.config}: unknown key {unknown[0]!r}; allowed: {sorted(allowed)}")
    for key in ("address", "runtime_env"):  # the command line wins over the file
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.resume:
        config["resume"] = True
    _write(search(**config), args.out)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tula-ray", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="re-plan offline from recorded profiles")
    replay.add_argument("profiles", nargs="?", type=Path)
    replay.add_argument("--synthetic", action="store_true",
                        help="generate profiles from a known model (+-5%% noise) instead")
    replay.add_argument("--seed", type=int, default=0)
    replay.add_argument("--epochs", type=int, default=20)
    replay.add_argument("--dataset-size", type=int, default=60000)
    _add_plan_options(replay)
    replay.set_defaults(run=_replay)

    demo = commands.add_parser("demo", help="a real search of the built-in CNN on local Ray")
    demo.add_argument("--cluster-sizes", type=int, nargs="+", default=[1, 2])
    demo.add_argument("--min-batch", type=int, default=32)
    demo.add_argument("--max-batch", type=int, default=2048,
                      help="upper bound on B (the memory probe may lower it)")
    demo.add_argument("--storage-path", type=storage_location, default=None,
                      help="where Tune keeps the trials (default ~/ray_results)")
    _add_plan_options(demo)
    add_address_option(demo)
    demo.add_argument("--train", action="store_true",
                      help="then train the choice as a Ray Train job (metrics CSV in --out)")
    add_train_options(demo)
    demo.set_defaults(run=_demo)

    from_file = commands.add_parser("search", help="a search described in a YAML file")
    from_file.add_argument("config", type=Path)
    from_file.add_argument("--out", type=Path, default=Path("plan"))
    add_address_option(from_file)
    from_file.add_argument("--resume", action="store_true",
                           help="continue the search the file names (its `name:`) if one was "
                                "saved, e.g. after the driver was killed")
    from_file.set_defaults(run=_search_file)

    add_train_command(commands)
    add_tune_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        args.run(args)
    except (ValueError, TypeError, FileNotFoundError) as error:  # bad input: no traceback
        print(f"tula-ray: error: {error}", file=sys.stderr)
        return 2
    except UserCodeError as error:  # the workload's own code: its traceback is the story
        print(f"tula-ray: the workload failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
