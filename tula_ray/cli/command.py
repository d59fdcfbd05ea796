"""The `tula-ray` command.

    tula-ray demo                 a real search on local Ray with the built-in workload
    tula-ray search CONFIG.yaml   a search described in a file (keys = tula_ray.search arguments)
    tula-ray replay PROFILES      re-fit and re-plan offline from recorded profiles (CSV or plan.json)
    tula-ray train PLAN.json      train the plan's chosen N and B as a Ray Train job (AGS by default)
    tula-ray tune PLAN.json       tune a strategy at the plan's N and B (Optuna + ASHA on Ray Tune)
    tula-ray demo --train         search, then train the choice

    --import MODULE_OR_FILE (any command, repeatable) imports your own extensions first: the
    search strategies, training strategies, pricings, compute forms and workloads a module
    registers (tula_ray.register_*) are then known to the command, e.g.
    tula-ray --import my_search.py replay --synthetic --search-strategy my-search

Ray and torch are imported only when a command runs, so `tula-ray --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path
from typing import Any

from tula_ray.cli.commands import run_demo, run_replay, run_search_file, run_train, run_tune
from tula_ray.cli.extensions import import_extensions
from tula_ray.cli.options import (METRICS_FILE, REPLAY_DATASET_SIZE_DEFAULT,
                                  REPLAY_EPOCHS_DEFAULT, STRATEGY_DEFAULT, TUNED_FILE,
                                  add_address_option, add_import_option, add_job_options,
                                  add_plan_options, add_train_options, storage_location)
from tula_ray.failures import UserCodeError
from tula_ray.planning.noise_checks import NoiseScaleWarning
from tula_ray.verbosity import wrap


def add_train_command(commands: Any) -> None:
    """The `train` subcommand on the `tula-ray` subparsers."""
    parser = commands.add_parser("train", help="train a plan's chosen N and B as a Ray Train job")
    parser.add_argument("plan", type=Path, help="a plan.json written by demo, search or replay")
    add_train_options(parser)
    add_job_options(parser, "where Ray Train keeps checkpoints", Path("train"), METRICS_FILE)
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
    add_job_options(parser, "where Ray Tune keeps the trials", Path("tune"), TUNED_FILE)
    add_address_option(parser)
    parser.set_defaults(run=run_tune)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tula-ray", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print everything Ray prints too (Ray's start, Ray Tune's boxes, "
                             "Ray Train's INFO logs) and tula-ray's INFO logs: verbose=2 of "
                             "tula_ray.search and train; errors and warnings print anyway")
    add_import_option(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    replay = commands.add_parser("replay", help="re-plan offline from recorded profiles")
    replay.add_argument("profiles", nargs="?", type=Path)
    replay.add_argument("--synthetic", action="store_true",
                        help="generate profiles from a known model (+-5%% noise) instead")
    replay.add_argument("--seed", type=int, default=0)
    replay.add_argument("--epochs", type=int, default=None,
                        help="E of eq. 4a, the epochs at --reference-batch (default: a "
                             "plan.json's own, else %d)" % REPLAY_EPOCHS_DEFAULT)
    replay.add_argument("--dataset-size", type=int, default=None,
                        help="samples per epoch (default: a plan.json's own, else %d)"
                             % REPLAY_DATASET_SIZE_DEFAULT)
    add_plan_options(replay)
    replay.set_defaults(run=run_replay)

    demo = commands.add_parser("demo", help="a real search of the built-in CNN on local Ray")
    demo.add_argument("--cluster-sizes", type=int, nargs="+", default=[1, 2])
    demo.add_argument("--min-batch", type=int, default=32)
    demo.add_argument("--max-batch", type=int, default=2048,
                      help="upper bound on B (the memory probe may lower it)")
    demo.add_argument("--storage-path", type=storage_location, default=None,
                      help="where Tune keeps the trials (default ~/ray_results)")
    add_plan_options(demo)
    add_address_option(demo)
    demo.add_argument("--train", action="store_true",
                      help="then train the choice as a Ray Train job (metrics CSV in --out)")
    add_train_options(demo)
    demo.set_defaults(run=run_demo)

    from_file = commands.add_parser("search", help="a search described in a YAML file")
    from_file.add_argument("config", type=Path)
    from_file.add_argument("--out", type=Path, default=Path("plan"))
    add_address_option(from_file)
    from_file.add_argument("--resume", action="store_true",
                           help="continue the search the file names (its `name:`) if one was "
                                "saved, e.g. after the driver was killed")
    from_file.set_defaults(run=run_search_file)

    add_train_command(commands)
    add_tune_command(commands)
    for command in commands.choices.values():  # `--import` after the command name too
        add_import_option(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        # The user's extensions first: the parser is built after them, so its choices are
        # read from the registries with what they added.
        import_extensions(_imports(argv))
    except (ImportError, ValueError, FileNotFoundError) as error:
        print(f"tula-ray: error: --import: {error}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    warnings.formatwarning = readable_warning
    if not args.verbose:  # every command that builds a plan prints its summary, which has it
        warnings.filterwarnings("ignore", category=NoiseScaleWarning)
    try:
        args.run(args)
    except (ValueError, TypeError, FileNotFoundError) as error:  # bad input: no traceback
        print(f"tula-ray: error: {error}", file=sys.stderr)
        return 2
    except UserCodeError as error:  # the workload's own code: its traceback is the story
        print(f"tula-ray: the workload failed: {error}", file=sys.stderr)
        return 1
    return 0


def readable_warning(message: Warning | str, category: type[Warning], filename: str,
                     lineno: int, line: str | None = None) -> str:
    """A Python warning as the command prints it: its class and message wrapped to 100
    columns, without Python's file, line and source line (the message says what to do)."""
    return wrap(f"warning: {category.__name__}: {message}") + "\n"


def _imports(argv: list[str]) -> list[str]:
    """The `--import` values of a command line, read before the full parser is built."""
    parser = argparse.ArgumentParser(add_help=False)
    add_import_option(parser)
    return parser.parse_known_args(argv)[0].imports
