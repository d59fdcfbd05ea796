"""What every benchmark records beside its figures: the command, commit, date and machine."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

RESULTS_DIR = Path(__file__).parent / "results"


# The commit a run's tree is at, when it runs from a copy whose git history is not the
# tree's (a device machine's copy of the working tree): set by whoever copied it.
COMMIT_ENV = "TULA_BENCHMARK_COMMIT"


def provenance() -> dict[str, Any]:
    given = os.environ.get(COMMIT_ENV)
    try:
        if given:
            raise OSError(f"{COMMIT_ENV} is set")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
        # Dirty: code changed since the commit. The benchmarks' own outputs (results/ and
        # BENCHMARKS.md, which a run rewrites as it goes) do not count.
        dirty = bool(subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":(exclude)benchmarks/results", ":(exclude)BENCHMARKS.md"],
            capture_output=True, text=True, cwd=Path(__file__).parents[1]).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = (f"{given} (from {COMMIT_ENV})" if given else "unknown"), False
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks", *sys.argv[1:]]),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
                   f"Python {platform.python_version()}",
    }


def relative_errors(predicted, measured) -> np.ndarray:
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    return np.abs(predicted - measured) / measured


def spread(values) -> str:
    """median [min, max] of a sample, for printing beside a figure."""
    values = np.asarray(values, float)
    return f"{np.median(values):.1%} [{values.min():.1%}, {values.max():.1%}]"


def spawn_gloo(worker: Callable[..., None], world_size: int, *args: Any,
               timeout_s: float | None = None) -> None:
    """Run worker(rank, *args) in world_size processes joined by a local gloo group, one
    torch thread each (N workers on N cores, as Ray Train places them here).

    The rendezvous is a file in a fresh private directory (torch's FileStore): unlike a
    "free" TCP port probed beforehand, nothing else can take it before the ranks start.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tula-gloo-") as scratch:
        init_method = f"file://{Path(scratch, 'rendezvous')}"
        mp.spawn(_gloo_rank, args=(worker, world_size, init_method, args, timeout_s),
                 nprocs=world_size, join=True)


def _gloo_rank(rank: int, worker: Callable[..., None], world_size: int, init_method: str,
               args: tuple, timeout_s: float | None = None) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            **timeout)
    try:
        worker(rank, *args)
        # No rank tears the group down while a peer may still be in a collective with it
        # (a rank aborting at exit, SIGABRT, was seen without this barrier).
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Done: leave without gloo's C++ teardown, where a rank still aborted now and then
    # after the barrier ("terminate called without an active exception", SIGABRT: once
    # in the full suite on 2026-11-27), failing a run whose work was all done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def cross_search_errors(partial_plan, full_plan):
    """(merged tables, relative errors) of a partial search's predicted step times against the
    step times a separate full search measured: model error plus run-to-run noise."""
    merged = partial_plan.table.merge(full_plan.table, on=["num_workers", "global_batch"],
                                      suffixes=("_partial", "_full"))
    errors = relative_errors(merged["step_time_s_partial"], merged["measured_step_time_s_full"])
    return merged, errors


def write_result(name: str, result: dict[str, Any], markdown: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=float))
    (RESULTS_DIR / f"{name}.md").write_text(markdown)
    return path
