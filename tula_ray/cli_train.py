"""The `tula-ray train` command and `tula-ray demo --train` (kept out of cli.py for its length).

    tula-ray train plan/plan.json --strategy ags --epochs 5 --out train

Ray and torch are imported only when a command runs, so `tula-ray --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any, Iterator

METRICS_FILE = "train_metrics.csv"
SHOWN_COLUMNS = ("epoch", "resumed_from", "train_loss", "train_accuracy", "test_loss",
                 "test_accuracy", "lr", "seconds", "scaled_fraction")


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by `train` and `demo --train`."""
    parser.add_argument("--strategy", default="ags",
                        help="ags (default, the paper's method) or a baseline: lbt, lrs, lars, "
                             "polo (tula_ray.strategies.STRATEGIES)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs to train (default: the plan's)")
    parser.add_argument("--max-failures", type=int, default=None,
                        help="restarts from the last checkpoint after a worker failure "
                             "(default: tula_ray.train's)")


def add_train_command(commands: Any) -> None:
    """The `train` subcommand on the `tula-ray` subparsers."""
    parser = commands.add_parser("train", help="train a plan's chosen N and B as a Ray Train job")
    parser.add_argument("plan", type=Path, help="a plan.json written by demo, search or replay")
    add_train_options(parser)
    parser.add_argument("--workload", default=None,
                        help="a built-in workload name, when the plan records none")
    parser.add_argument("--storage-path", type=Path, default=None,
                        help="where Ray Train keeps checkpoints (default ~/ray_results)")
    parser.add_argument("--out", type=Path, default=Path("train"),
                        help=f"directory for {METRICS_FILE}")
    parser.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> None:
    """`tula-ray train`: the plan file must exist before Ray is started."""
    if not args.plan.is_file():
        raise FileNotFoundError(f"plan file {args.plan} does not exist; write one with "
                                "`tula-ray demo` or `tula-ray replay`")
    train_and_write(args.plan, args, workload=args.workload)


def train_and_write(plan: Any, args: argparse.Namespace, workload: str | None = None) -> None:
    """Train `plan` (a Plan or a path), print the per-epoch table, write the metrics CSV."""
    from tula_ray.relaunch import train  # imports ray

    storage = str(args.storage_path.resolve()) if args.storage_path else None
    retries = {} if args.max_failures is None else {"max_failures": args.max_failures}
    result = train(plan, args.strategy, workload=workload, epochs=args.epochs,
                   storage_path=storage, **retries)
    shown = [c for c in SHOWN_COLUMNS if c in result.metrics.columns]
    print(f"trained N={result.num_workers}, B={result.global_batch} with {result.strategy}:")
    print(result.metrics[shown].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    args.out.mkdir(parents=True, exist_ok=True)
    result.metrics.to_csv(args.out / METRICS_FILE, index=False)
    print(f"wrote {args.out / METRICS_FILE}; last checkpoint {result.checkpoint_path}")


@contextlib.contextmanager
def ray_session(enabled: bool) -> Iterator[None]:
    """One local Ray for several steps (demo: search then train) instead of one each."""
    if not enabled:
        yield
        return
    import ray

    from tula_ray.api import ensure_ray

    started = ensure_ray()
    try:
        yield
    finally:
        if started:
            ray.shutdown()
