"""What the training strategy adds to a profiled step (issue 14, item 7): the profiling
loop's phase 4, once per worker group.

At the smallest local batch the strategy takes as configured, plain synced steps on the
worker group's model, then as many with the strategy's optimizer and hooks
(`StrategySetup`) on a fresh copy of the model (a strategy may register a DDP comm hook,
which a model takes only once). AGS's costs are per step and per tensor (scales, a host
sync, all-reduces), so a small batch, where they stand out of the timing noise, serves.
"""

from __future__ import annotations

import math
from typing import Any

import ray.train.torch
import torch

from tula_ray.distributed import max_over_ranks
from tula_ray.training.epochs import EpochTally
from tula_ray.training.step_timing import (ALTERNATING_BLOCKS, mean_step_s,
                                           measured_step_count, time_block)
from tula_ray.training.strategies import build_strategy, get_training_strategy


def strategy_batch(config: dict[str, Any], world_size: int, first_batch: int,
                    dataset_size: int) -> tuple[int | None, dict[str, Any]]:
    """(global batch, options) at which the sweep measures the training strategy: the
    smallest from `first_batch` up (doubling) that the strategy takes as configured, its
    options unchanged and without notes; else the smallest where it changed its options
    (AGS switches its source where its small batch does not fit: still AGS, at another
    cost); else the smallest it takes at all (notes alone say it runs reduced there: AGS's
    plain steps at a B no larger than its reference batch, PoLo on one worker); (None, {})
    without a strategy or a batch."""
    if not config.get("training_strategy"):
        return None, {}
    strategy = get_training_strategy(config["training_strategy"])
    given = dict(config.get("training_options") or {})
    changed, reduced = [], []
    global_batch = first_batch
    while global_batch <= dataset_size:
        try:
            options, notes = strategy.check(world_size, global_batch, dict(given))
        except ValueError:
            options, notes = None, []
        if options == given and not notes:
            return global_batch, options
        if options is not None:
            (changed if options != given else reduced).append((global_batch, options))
        global_batch *= 2
    return (changed + reduced)[0] if changed or reduced else (None, {})


def measure_strategy_extra_s(sweep: Any) -> float:
    """Seconds the training strategy adds to one step (the profiling loop's phase 4), the
    slowest worker's strategy mean less the slowest worker's plain mean, at
    `sweep.strategy_batch`; `sweep`: the loop's worker group (model, data, config, and
    `agreement`: each part below ends with the workers' agreement, so that a failure on
    one worker, the second model out of memory most likely, stops them all). Both steps
    are the data path's (`EpochTally.step` on the sweep's batches), in alternating blocks:
    a difference of two means on a shared machine is all drift when they are timed one
    after the other (searches here measured 2-9 ms for the same AGS-NS step so)."""
    agree = sweep.agreement.run
    global_batch = sweep.strategy_batch
    batches = sweep.batches(global_batch // sweep.world_size)
    plain = EpochTally(sweep.model, sweep.plain, sweep.loss_fn, sweep.device)
    first = agree("strategy: first plain step",
                  lambda: time_block(1, lambda: plain.step(*next(batches)), sweep.device))
    (first_s,) = max_over_ranks(first, sweep.device)
    # Plain and strategy steps share one phase's budget: its cost is what the plan needs.
    count = measured_step_count(first_s, sweep.measure, sweep.budget_s / 2)
    # The second model, built and placed without a collective, then wrapped (DDP's
    # broadcast, its buckets): each agreed on apart.
    model = agree("strategy: second model",
                  lambda: sweep.workload.model_fn().to(sweep.device))

    tally = agree("strategy: setup", lambda: _strategy_tally(sweep, model, global_batch))
    # The strategy's first step builds the optimizer's state: untimed. Each block's first
    # step after the other model's is untimed too (`sweep.transition`: BatchNorm's
    # buffers broadcast then, as in the sweep's own alternating blocks).
    agree("strategy: first step", lambda: tally.step(*next(batches)))
    blocks = min(ALTERNATING_BLOCKS, count)
    per_block = math.ceil(count / blocks)
    plain_s: list[float] = []
    seconds: list[float] = []
    for _ in range(blocks):
        plain_s += agree("strategy: plain steps", lambda: time_block(
            per_block, lambda: plain.step(*next(batches)), sweep.device,
            transition=sweep.transition))
        seconds += agree("strategy: steps", lambda: time_block(
            per_block, lambda: tally.step(*next(batches)), sweep.device,
            transition=sweep.transition))
    strategy_mean, plain_mean = max_over_ranks(
        [mean_step_s(seconds), mean_step_s(plain_s)], sweep.device)
    return strategy_mean - plain_mean


def _strategy_tally(sweep: Any, model: torch.nn.Module, global_batch: int) -> EpochTally:
    """The strategy's steps on `model` (the second model), wrapped as `train` wraps it
    (DDP), with the strategy's optimizer and hooks at `global_batch`, in its precision."""
    wrapped = ray.train.torch.prepare_model(model)
    wrapped.train()
    setup = build_strategy(
        get_training_strategy(sweep.config["training_strategy"]), wrapped,
        global_batch=global_batch,
        steps_per_epoch=max(1, len(sweep.dataset) // global_batch),  # type: ignore[arg-type]
        epochs=int(sweep.config.get("epochs") or sweep.workload.epochs),
        options=sweep.strategy_options, optimizer_fn=sweep.workload.optimizer_fn)
    setup.set_precision(sweep.workload.precision, sweep.device)  # as `train` sets it
    setup.start_epoch(0)
    return EpochTally(wrapped, setup, sweep.loss_fn, sweep.device)
