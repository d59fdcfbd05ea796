"""The acceptance run's check of one rank out of memory in a synced step (issue 46, item 3):
two ranks profile one batch in synced blocks (`profile_sweep.profile_batch` over
`profile_phases.synced_block`, the profiling step's own code), each step all-reduces a
gradient, and rank 1 runs out of memory at its third step. Both rows must read "oom" and
both ranks must have ended within BOTH_END_S of starting the batch.

With two GPUs or more the ranks are NCCL's, one GPU each, and the failing rank's
allocation is real (twice its GPU's memory): the peer's host goes on past the all-reduce
NCCL queued and waits for its GPU, as on a cluster. NCCL refuses two ranks on one GPU, so
with fewer GPUs the ranks are gloo's on the CPU, with a stand-in that queues each step's
all-reduce and waits for them at the block's end (what NCCL's stream does) and a raised
`torch.OutOfMemoryError`: the same code path, not the device's.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.common import spawn_gloo

FAILING_RANK = 1
FAILING_STEP = 2  # counted from 0: the third step
BLOCK_STEPS = 4
BOTH_END_S = 30.0  # the goal
GROUP_TIMEOUT_S = 45  # a rank left waiting ends after this (the group's timeout): too late
GRADIENT_ELEMENTS = 1 << 20  # a 4 MiB all-reduce a step


class QueuedAllReduces:
    """On gloo, what NCCL's stream does: a step's all-reduce is queued and the host goes on
    (`all_reduce`); the wait for the device (`step_timing.synchronize`) waits for them all."""

    def __init__(self) -> None:
        self.queued: list = []

    def all_reduce(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        self.queued.append(dist.all_reduce(tensor, async_op=True))

    def wait(self, device) -> None:
        while self.queued:
            self.queued.pop(0).wait()


def _out_of_memory(device: torch.device) -> None:
    if device.type == "cuda":  # a real allocation failure: twice the GPU
        total = torch.cuda.get_device_properties(device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=device)
    raise torch.OutOfMemoryError("CUDA out of memory (stand-in raised on the CPU)")


def _rank(rank: int, directory: str, backend: str) -> None:
    import torch.distributed as dist

    import tula_ray.training.step_timing as step_timing
    from tula_ray.training.phase_agreement import PhaseAgreement
    from tula_ray.training.profile_phases import synced_block
    from tula_ray.training.profile_sweep import profile_batch

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    queue = QueuedAllReduces()
    if backend != "nccl":
        step_timing.synchronize = queue.wait  # this spawned process's only
    gradient = torch.ones(GRADIENT_ELEMENTS, device=device)
    steps = itertools.count()

    def run_step() -> None:
        if rank == FAILING_RANK and next(steps) == FAILING_STEP:
            _out_of_memory(device)
        if backend == "nccl":
            dist.all_reduce(gradient)  # queued on the GPU's stream; the host goes on
        else:
            queue.all_reduce(gradient)

    training = SimpleNamespace(agreement=PhaseAgreement(device), device=device, transition=0)
    sweep = SimpleNamespace(world_size=2, num_nodes=1, workload=SimpleNamespace(name="synced"),
                            profile=lambda _: {"step_time_s": sum(synced_block(
                                training, run_step, BLOCK_STEPS)) / BLOCK_STEPS})
    started = time.time()
    row = profile_batch(sweep, 64)
    Path(directory, f"{rank}.json").write_text(json.dumps(
        {"status": row["status"], "failure": row["failure"], "error": row["error"][:200],
         "started": started, "row_s": time.time() - started}))
    # A peer's all-reduce may still be queued on the default group: no collective after it.
    os._exit(0)


def one_rank_out_of_memory(device: torch.device) -> dict[str, Any]:
    """The check's result: backend, why, each rank's row, the seconds from the first rank
    starting the batch until both processes had ended, and whether it passed."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    backend = "nccl" if gpus >= 2 else "gloo"
    why = (f"NCCL ranks, one GPU each of {gpus}, a real allocation failure" if backend == "nccl"
           else "gloo ranks on the CPU, " + ("one GPU: NCCL refuses two ranks on one GPU"
                                              if gpus == 1 else "no GPU")
           + "; a stand-in queues the all-reduces and raises the OOM")
    with tempfile.TemporaryDirectory(prefix="tula-synced-oom-") as directory:
        spawn_gloo(_rank, 2, directory, backend, timeout_s=GROUP_TIMEOUT_S, backend=backend)
        ended = time.time()
        rows = [{"rank": rank, **json.loads(Path(directory, f"{rank}.json").read_text())}
                for rank in (0, 1)]
    both_ended_s = ended - min(row.pop("started") for row in rows)
    passed = both_ended_s <= BOTH_END_S and all(
        (row["status"], row["failure"]) == ("oom", "oom") for row in rows)
    return {"backend": backend, "how": why, "failing_rank": FAILING_RANK,
            "failing_step": FAILING_STEP + 1, "rows": rows, "both_ended_s": both_ended_s,
            "limit_s": BOTH_END_S, "passed": passed}


def report_line(check: dict[str, Any]) -> str:
    rows = "; ".join(f"rank {row['rank']}: {row['status']} ({row['error'].split(':')[0]})"
                     for row in check["rows"])
    return (f"- One rank out of memory in a synced step ({check['how']}; rank "
            f"{check['failing_rank']} at its step {check['failing_step']}): both ranks ended "
            f"{check['both_ended_s']:.1f} s after the batch began (limit {check['limit_s']:.0f}"
            f" s); rows: {rows}; {'PASSED' if check['passed'] else 'FAILED'}.")
