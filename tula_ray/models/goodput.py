"""Goodput (issue 44): what a batch size buys per second once its statistical efficiency
is counted, the quantity an adaptive global batch maximises (Pollux, Qiao et al. OSDI '21,
eq. 3: GOODPUT = THROUGHPUT x EFFICIENCY).

A step at B processes B samples, but only E(B) = (phi + M0) / (phi + B) of them count
toward the accuracy that M0's samples reach (`noise_scale.efficiency`): goodput is the
samples per second at B times E(B), in reference samples per second. phi grows as the
model learns, so the B with the most goodput grows with it. Where B / N exceeds what a
worker's memory holds, the step accumulates gradients over micro-batches
(`accumulation_steps`), as Pollux does. No Ray here (core module).
"""

from __future__ import annotations

import math
from typing import Mapping

from tula_ray.models.noise_scale import efficiency

SWITCH_GAIN_DEFAULT = 0.05  # the least predicted goodput gain that switches the batch


def goodput(samples_per_s: float, noise_scale: float, global_batch: float,
            reference_batch: float) -> float:
    """Pollux's eq. 3: throughput(B) x E(B), in reference-batch samples per second (the
    rate at which a run at B does the work of a run at M0)."""
    return samples_per_s * efficiency(noise_scale, global_batch, reference_batch)


def accumulation_steps(global_batch: int, num_workers: int, max_local_batch: int | None) -> int:
    """Micro-batches per step so that each holds at most `max_local_batch` samples on a
    worker (1: the local batch B / N fits; None: no bound known)."""
    local = global_batch / num_workers
    if max_local_batch is None or local <= max_local_batch:
        return 1
    return math.ceil(local / max_local_batch)


def best_batch(goodputs: Mapping[int, float]) -> int:
    """The batch with the most goodput; among equal ones the smallest (fewest samples per
    step for the same progress). NaN goodputs never win."""
    known = {batch: value for batch, value in goodputs.items() if not math.isnan(value)}
    if not known:
        raise ValueError(f"no batch has a known goodput: {dict(goodputs)}")
    return min(known, key=lambda batch: (-known[batch], batch))


def switched_batch(current: int | None, goodputs: Mapping[int, float],
                   min_gain: float = SWITCH_GAIN_DEFAULT) -> int:
    """Hysteresis: the best batch when it predicts at least `min_gain` (relative) more
    goodput than `current`, else `current` (a switch costs a changed data path and LR, and
    near-equal goodputs would flip with the noise of phi). No current batch, or one no
    longer allowed: the best."""
    best = best_batch(goodputs)
    now = goodputs.get(current, math.nan) if current is not None else math.nan
    if math.isnan(now) or not now > 0:
        return best
    return best if goodputs[best] >= now * (1.0 + min_gain) else current
