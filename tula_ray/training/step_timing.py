"""Timing training steps as an epoch runs them (issue 24), for the profiling loop and a
Ray-free check on one process: the step is the data path's (`EpochTally.step` on the next
batch of `tula_ray.training.batches`), steps run in blocks with no host sync inside, so a
GPU's queue stays as full as in `train_epoch`, and each step is marked as it is queued
(CUDA events on a GPU, the clock on CPU); the device is synchronised at a block's ends.
No Ray here (core module).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Callable, Iterable, Iterator

import torch

from tula_ray.training.measure import synchronize

MAX_MEASURE_STEPS = 64
# Blocks per timed phase, alternated with the phase they are compared with (compute-only
# with synced steps, plain with the strategy's): the machine's drift falls on both alike.
ALTERNATING_BLOCKS = 3
# A GPU's steps are milliseconds: the phase's time budget, not this cap, bounds them.
MAX_MEASURE_STEPS_GPU = 1024


def cycle(batches: Iterable) -> Iterator:
    """Batches forever; a new shuffle (`set_epoch`) on each pass over the data."""
    for epoch in itertools.count():
        set_epoch = getattr(batches, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)
        yield from batches


def time_block(count: int, run_step: Callable[[], object], device: torch.device | str, *,
               transition: int = 0,
               before_wait: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of `count` calls of `run_step()`, run back to back after
    `transition` untimed ones (a block's first step may differ: with BatchNorm, DDP
    broadcasts buffers in the forward after a synced step, not after a `no_sync` one).

    before_wait: called once every step is queued, before the wait for the device (the
    workers' agreement, `PhaseAgreement.before_wait`): a collective that a peer never
    joined holds the device's queue, and a wait behind it would never end."""
    device = torch.device(device)
    for _ in range(transition):
        run_step()
    synchronize(device)
    if device.type == "cuda":
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        marks[0].record()
        for mark in marks[1:]:
            run_step()
            mark.record()
        if before_wait is not None:
            before_wait()
        marks[-1].synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in zip(marks, marks[1:])]
    clock = [time.perf_counter()]
    for _ in range(count):
        run_step()
        clock.append(time.perf_counter())
    if before_wait is not None:
        before_wait()
    synchronize(device)  # the block's wait; nothing is left queued on a CPU
    return [end - start for start, end in zip(clock, clock[1:])]


def alternating_blocks(first: Callable[[int], list[float]],
                       second: Callable[[int], list[float]] | None,
                       steps: int) -> tuple[list[float], list[float]]:
    """At least `steps` timed steps of each of two kinds in alternating blocks, a block of
    `first` then one of `second`, ALTERNATING_BLOCKS times (fewer for fewer steps), so
    that a drift of the machine's speed (clocks, other load) falls on both alike; each
    call `first(count)` / `second(count)` times `count` steps and returns their seconds.
    `second` None: one block of `first`, nothing to alternate with. Returns (first's
    seconds, second's seconds)."""
    blocks = min(ALTERNATING_BLOCKS, steps) if second is not None else 1
    per_block = math.ceil(steps / blocks)
    first_s: list[float] = []
    second_s: list[float] = []
    for _ in range(blocks):
        first_s += first(per_block)
        if second is not None:
            second_s += second(per_block)
    return first_s, second_s


def warm_up(run_step: Callable[[], object], device: torch.device | str, *, min_steps: int,
            min_seconds: float, max_steps: int = MAX_MEASURE_STEPS) -> list[float]:
    """Untimed-for-the-plan steps until at least `min_steps` ran and `min_seconds` passed
    (a GPU's clocks ramp up over a fraction of a second; a few millisecond steps would
    leave them low), at most `max_steps`. Returns each step's seconds."""
    seconds: list[float] = []
    started = time.perf_counter()
    while len(seconds) < max_steps and (
            len(seconds) < min_steps or time.perf_counter() - started < min_seconds):
        seconds += time_block(1, run_step, device)
    return seconds


def mean_step_s(seconds: list[float]) -> float:
    """The step time an epoch adds up: the mean, hiccups included (the median of short
    steps on a shared machine leaves out the ~5 % that an epoch's sum keeps)."""
    return statistics.fmean(seconds) if seconds else math.nan


def spread(seconds: list[float]) -> float:
    """Interquartile range over median: the run's own timing noise (NOTES-ENV: ~15 %)."""
    if len(seconds) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(seconds, n=4)
    return (q3 - q1) / statistics.median(seconds)


def max_measure_steps(device: torch.device | str) -> int:
    """The most steps a timed phase takes on `device`."""
    return MAX_MEASURE_STEPS_GPU if torch.device(device).type == "cuda" else MAX_MEASURE_STEPS


def measured_step_count(warmup_step_s: float, min_steps: int, budget_s: float,
                        max_steps: int = MAX_MEASURE_STEPS) -> int:
    """Steps per timed phase: at least `min_steps`, more while they fit in `budget_s`."""
    if not math.isfinite(warmup_step_s) or warmup_step_s <= 0:
        return min_steps
    return max(min_steps, min(max_steps, int(budget_s // warmup_step_s)))
