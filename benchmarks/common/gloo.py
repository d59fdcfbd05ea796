"""spawn_gloo: a benchmark's (or a test's) workers as local processes joined by gloo."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable


def spawn_gloo(worker: Callable[..., None], world_size: int, *args: Any,
               timeout_s: float | None = None, backend: str = "gloo") -> None:
    """Run worker(rank, *args) in world_size processes joined by a local gloo group, one
    torch thread each (N workers on N cores, as Ray Train places them here). backend="nccl"
    joins them by NCCL instead, rank r on GPU r (one GPU a rank: NCCL refuses two ranks on
    one GPU).

    The rendezvous is a file in a fresh private directory (torch's FileStore): unlike a
    "free" TCP port probed beforehand, nothing else can take it before the ranks start.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tula-gloo-") as scratch:
        init_method = f"file://{Path(scratch, 'rendezvous')}"
        mp.spawn(_gloo_rank, args=(worker, world_size, init_method, args, timeout_s, backend),
                 nprocs=world_size, join=True)


def _gloo_rank(rank: int, worker: Callable[..., None], world_size: int, init_method: str,
               args: tuple, timeout_s: float | None = None, backend: str = "gloo") -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
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
