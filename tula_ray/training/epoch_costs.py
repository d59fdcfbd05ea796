"""What an epoch of `tula_ray.train` costs beyond its training steps (issue 24), measured
once per worker group while profiling: one evaluation pass (`train` scores the test set
after every epoch) and one checkpoint write with its upload to the run's storage (rank 0
keeps one per epoch). The plan adds both to each epoch, as their own columns. No Ray here
(core module); the upload goes through pyarrow's file systems, as Ray Train's does.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import uuid
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import pyarrow.fs
import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from tula_ray.distributed import max_over_ranks
from tula_ray.training.batches import evaluation_batches
from tula_ray.training.checkpoints import checkpoint_state
from tula_ray.training.epochs import evaluate
from tula_ray.training.measure import StepTimer
from tula_ray.training.strategy_base import StrategySetup

EVAL_PROBE_BATCHES = 2  # evaluation batches per rank timed beyond a 1-batch pass, at least
EVAL_PROBE_SECONDS = 0.05  # ... and at least this long a 1-batch pass's worth, in batches
# The timed checkpoint's directory in the storage, removed after it: a dot name no run,
# trial or experiment of Ray's takes, made unique per write.
CHECKPOINT_PROBE_PREFIX = ".tula-checkpoint-probe-"
# Ray Train's upload of a checkpoint (ray/train/_internal/storage.py,
# `_pyarrow_fs_copy_files`): large chunks, and no threads on S3 (apache/arrow#32372).
UPLOAD_CHUNK_BYTES = 64 * 1024 * 1024


def evaluation_s(model: nn.Module, test_set: Dataset, loss_fn, device: torch.device, *,
                 eval_batch: int, num_replicas: int = 1, rank: int = 0,
                 probe_batches: int = EVAL_PROBE_BATCHES,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> float:
    """Seconds of one `evaluate` pass over `test_set` on this worker group, the slowest
    rank's, in batches of `eval_batch` (`tula_ray.training.data.evaluation_batch`), from
    a few batches (a large model's full pass would cost the profile as much as an epoch).

    A pass is a fixed cost (entering `evaluate`, the all-reduce of its sums, waiting there
    for the other ranks) plus one cost per batch. Passes of 1 and of 1 + `probe_batches`
    batches per rank (more where a batch is short: `EVAL_PROBE_SECONDS`) are timed: their
    difference is the batches', the rest the fixed cost, counted once. One short pass
    scaled up to the rank's share would count the fixed cost once per probe (train-time
    at d6ebabe: the CNN's pass at N = 2, b = 16, 1.09 s profiled so, 0.58 s in `train`)."""
    size = len(test_set)  # type: ignore[arg-type]
    share = math.ceil((size - rank) / num_replicas)
    full_batches = math.ceil(share / eval_batch)

    def timed_pass(count: int) -> float:
        subset = Subset(test_set, range(min(size, count * eval_batch * num_replicas)))
        batches = evaluation_batches(subset, eval_batch, device, num_replicas=num_replicas,
                                     rank=rank)
        with StepTimer(device) as timer:
            evaluate(model, batches, device, loss_fn, autocast=autocast)
        return timer.seconds

    # One pass untimed first: a first pass's one-off costs (set-up for a new batch shape
    # and precision, allocations) fall in `train`'s first epoch only, not in the later
    # ones the plan predicts; scaled up from two batches, something of the kind had
    # doubled bf16's predicted pass at random (train-time's bf16 plans at b21805e, e9fb50d).
    timed_pass(1)
    one = timed_pass(1)
    # Enough batches that their time stands out of the timer's noise: a small batch's
    # milliseconds would not (a CPU's clock and the other rank's wait vary by about that).
    probe = max(probe_batches, math.ceil(EVAL_PROBE_SECONDS / max(one, 1e-6)))
    (most,) = max_over_ranks([float(probe)], device)  # the ranks pass alike
    probe = min(full_batches - 1, int(most))
    per_batch = max(0.0, (timed_pass(1 + probe) - one) / probe) if probe > 0 else 0.0
    seconds = max(one - per_batch, 0.0) + per_batch * full_batches
    (seconds,) = max_over_ranks([seconds], device)
    return seconds


def checkpoint_s(model: nn.Module, setup: StrategySetup, device: torch.device, *,
                 rank: int = 0, storage_path: str | None = None,
                 filesystem: pyarrow.fs.FileSystem | None = None) -> float:
    """Seconds rank 0 takes to keep one epoch's checkpoint as `train` does, agreed over
    the ranks: `checkpoint_state`, `torch.save` to a local directory, and that directory's
    upload to `storage_path` (a local path or a URI such as s3://, file://), which Ray
    Train makes of every reported checkpoint, by the same pyarrow copy
    (`upload_directory`); the copy goes to a scratch directory (`scratch_directory`)
    removed after the timing. `filesystem`: a pyarrow FileSystem that `storage_path` is a
    path on, as Ray's `RunConfig(storage_filesystem=)`. Without a storage path the local
    write is timed alone (the search passes its own, or Ray's default ~/ray_results)."""
    seconds = 0.0
    if rank == 0:
        target = (contextlib.nullcontext() if storage_path is None
                  else scratch_directory(storage_path, filesystem))
        with tempfile.TemporaryDirectory() as directory, target as scratch:
            with StepTimer(device) as timer:
                torch.save(checkpoint_state(model, setup, 0), Path(directory) / "state.pt")
                if scratch is not None:
                    upload_directory(directory, *scratch)
            seconds = timer.seconds
    (seconds,) = max_over_ranks([seconds], device)
    return seconds


def storage_filesystem(storage_path: str, filesystem: pyarrow.fs.FileSystem | None = None
                       ) -> tuple[pyarrow.fs.FileSystem, str]:
    """pyarrow's file system and path of `storage_path`, as Ray Train resolves them
    (`get_fs_and_path`): `filesystem` and the path as given, else the URI's own file
    system (a local path's, expanded)."""
    if filesystem is not None:
        return filesystem, storage_path
    if "://" not in storage_path:
        storage_path = str(Path(storage_path).expanduser().resolve())
    return pyarrow.fs.FileSystem.from_uri(storage_path)


@contextlib.contextmanager
def scratch_directory(storage_path: str, filesystem: pyarrow.fs.FileSystem | None = None
                      ) -> Iterator[tuple[pyarrow.fs.FileSystem, str]]:
    """A file system and a new path under `storage_path` (CHECKPOINT_PROBE_PREFIX), with
    whatever was written there removed on exit."""
    storage, root = storage_filesystem(storage_path, filesystem)
    scratch = f"{root.rstrip('/')}/{CHECKPOINT_PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        yield storage, scratch
    finally:
        if storage.get_file_info(scratch).type != pyarrow.fs.FileType.NotFound:
            storage.delete_dir(scratch)


def upload_directory(directory: str, storage: pyarrow.fs.FileSystem, path: str) -> None:
    """Copies the local `directory` to `path` on `storage` as Ray Train persists a
    checkpoint (`create_dir`, then `pyarrow.fs.copy_files`): a storage that refuses the
    write raises, as it would fail `train`'s checkpoint."""
    s3 = getattr(pyarrow.fs, "S3FileSystem", None)  # absent from a pyarrow built without S3
    storage.create_dir(path, recursive=True)
    pyarrow.fs.copy_files(directory, path, destination_filesystem=storage,
                          chunk_size=UPLOAD_CHUNK_BYTES,
                          use_threads=not (s3 is not None and isinstance(storage, s3)))
