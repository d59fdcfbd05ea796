"""Timing training steps inside a Ray Train worker group (the profiling loop's tools):
batches forever, timed steps, the slowest worker's figures, a run's own spread."""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader

from tula_ray.training.measure import StepTimer, train_step

MAX_MEASURE_STEPS = 64


def cycle(loader: DataLoader) -> Iterator:
    """Batches forever; a new shuffle (sampler epoch) on each pass over the data."""
    for epoch in itertools.count():
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader


def timed(count: int, batches: Iterator, step: Callable[[Any, Any], Any],
          device: torch.device) -> list[float]:
    """Seconds of each of `count` calls step(inputs, targets), one batch each."""
    seconds = []
    for _ in range(count):
        inputs, targets = next(batches)
        with StepTimer(device) as timer:
            step(inputs, targets)
        seconds.append(timer.seconds)
    return seconds


def timed_steps(count: int, batches: Iterator, model, optimizer, loss_fn,
                device: torch.device) -> list[float]:
    """Seconds of `count` plain training steps (`tula_ray.training.measure.train_step`)."""
    return timed(count, batches, functools.partial(train_step, model, optimizer, loss_fn),
                 device)


def spread(seconds: list[float]) -> float:
    """Interquartile range over median: the run's own timing noise (NOTES-ENV: ~15 %)."""
    if len(seconds) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(seconds, n=4)
    return (q3 - q1) / statistics.median(seconds)


def measured_step_count(warmup_step_s: float, min_steps: int, budget_s: float,
                        max_steps: int = MAX_MEASURE_STEPS) -> int:
    """Steps per timed phase: at least `min_steps`, more while they fit in `budget_s`."""
    if not math.isfinite(warmup_step_s) or warmup_step_s <= 0:
        return min_steps
    return max(min_steps, min(max_steps, int(budget_s // warmup_step_s)))
