"""What an epoch of `tula_ray.train` costs beyond its training steps (issue 24), measured
once per worker group while profiling: one evaluation pass (`train` scores the test set
after every epoch) and one checkpoint write (rank 0 keeps one per epoch). The plan adds
both to each epoch, as their own columns. No Ray here (core module).
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from pathlib import Path
from typing import Callable, ContextManager

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from tula_ray.distributed import max_over_ranks
from tula_ray.training.batches import evaluation_batches
from tula_ray.training.checkpoints import checkpoint_state
from tula_ray.training.epochs import evaluate
from tula_ray.training.measure import StepTimer
from tula_ray.training.strategy_base import StrategySetup

EVAL_PROBE_BATCHES = 2  # evaluation batches timed per rank; the pass is scaled from them


def evaluation_s(model: nn.Module, test_set: Dataset, loss_fn, device: torch.device, *,
                 eval_batch: int, num_replicas: int = 1, rank: int = 0,
                 probe_batches: int = EVAL_PROBE_BATCHES,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> float:
    """Seconds of one `evaluate` pass over `test_set` on this worker group, the slowest
    rank's: `probe_batches` batches per rank are timed (the pass through `evaluate`
    itself, its all-reduce included) and scaled to the rank's whole share, which
    `train` evaluates in batches of `eval_batch` (`tula_ray.training.data.evaluation_batch`;
    a large model's full pass would cost the profile as much as an epoch)."""
    size = len(test_set)  # type: ignore[arg-type]
    share = math.ceil((size - rank) / num_replicas)
    full_batches = math.ceil(share / eval_batch)
    probe = min(probe_batches, full_batches)

    def batches_of(count: int):
        subset = Subset(test_set, range(min(size, count * eval_batch * num_replicas)))
        return evaluation_batches(subset, eval_batch, device, num_replicas=num_replicas,
                                  rank=rank)

    # One batch untimed first: a first pass's one-off costs (set-up for a new batch shape
    # and precision, allocations) fall in `train`'s first epoch only, not in the later
    # ones the plan predicts; scaled up from two batches, something of the kind had
    # doubled bf16's predicted pass at random (train-time's bf16 plans at b21805e, e9fb50d).
    evaluate(model, batches_of(1), device, loss_fn, autocast=autocast)
    batches = batches_of(probe)
    with StepTimer(device) as timer:
        evaluate(model, batches, device, loss_fn, autocast=autocast)
    (seconds,) = max_over_ranks([timer.seconds * full_batches / max(probe, 1)], device)
    return seconds


def checkpoint_s(model: nn.Module, setup: StrategySetup, device: torch.device, *,
                 rank: int = 0) -> float:
    """Seconds rank 0 takes to write one epoch's checkpoint (`checkpoint_state`, then
    `torch.save` to a local file), agreed over the ranks. A cloud upload is not in it:
    the storage's speed is not known here."""
    seconds = 0.0
    if rank == 0:
        with tempfile.TemporaryDirectory() as directory, StepTimer(device) as timer:
            torch.save(checkpoint_state(model, setup, 0), Path(directory) / "state.pt")
        seconds = timer.seconds
    (seconds,) = max_over_ranks([seconds], device)
    return seconds
