"""The plan's prediction of an adaptive-batch run (issue 44, item 2): beside the fixed
candidates of each cluster size N, one row "adaptive at N", the run that switches its
global batch as the noise scale grows (Pollux, Qiao et al. OSDI '21).

The model. Inside N, at each point of progress the run trains at the candidate batch of
that N with the most goodput (`tula_ray.models.goodput`), with the hysteresis of
`switched_batch` (a switch only for `SWITCH_GAIN_DEFAULT` more). The candidates are
N's batches of the plan that the plan refuses for no memory reason; those above the local
memory bound accumulate gradients (`accumulated_step_s`). Progress is counted in
reference-batch samples: the run does the work of the plan's epochs at M0
(`reference_samples`); at batch B and noise scale phi, a second yields goodput =
samples/s(B) x E(B) of them, E(B) = (phi + M0) / (phi + B). phi follows the trajectory
the plan states (`tula_ray.planning.noise_trajectory`); `integrate_adaptive_run` sums the
seconds over `ADAPTIVE_SLICES` equal slices of progress, phi at each slice's middle.

The batch at each slice is the one the run itself would take there: `train`'s controller
(`tula_ray.training.batch_controller`) ranks the batches by the steps it is given,
`run_step_s` (eq. 2a's prediction plus the strategy's cost per step; accumulated above
the memory bound), and the row ranks them alike. Its seconds count what the fixed rows'
time to accuracy counts (`accuracy.add_time_to_accuracy`), per trained sample
(`seconds_per_sample`): the step (measured where profiled, else predicted; the
strategy's cost per step included), and the evaluation and checkpoint of each epoch
spread over the samples of an epoch at B; the start-up is added once. So under a
constant phi the row stays at the batch the run would keep, in that fixed row's time to
accuracy. Core: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from tula_ray.models import perf
from tula_ray.models.goodput import SWITCH_GAIN_DEFAULT, accumulation_steps, goodput, switched_batch
from tula_ray.models.noise_scale import efficiency
from tula_ray.planning.noise_trajectory import NoiseTrajectory

ADAPTIVE_SLICES = 200  # equal slices of progress the run's seconds are summed over


def accumulated_step_s(params: perf.PerfParams, num_workers: int, global_batch: int,
                       max_local_batch: int | None) -> tuple[float, int]:
    """(step seconds, micro-steps k) of a step at B on N workers whose local batch B / N
    is split into k micro-batches of at most `max_local_batch` (`accumulation_steps`):
    k - 1 micro-steps of compute alone, then one that syncs, eq. 2a at the micro-batch
    (its all-reduce overlaps that backward as a plain step's does). k = 1: eq. 2a."""
    steps = accumulation_steps(global_batch, num_workers, max_local_batch)
    micro = global_batch / num_workers / steps
    compute = float(perf.predict_compute_s(params, num_workers, micro))
    sync = float(perf.predict_sync_s(params, num_workers, micro))
    last = float(perf.combine_step_s(compute, sync, params.overlap_p))
    return (steps - 1) * compute + last, steps


def adaptive_step_times(params: perf.PerfParams, num_workers: int, batches: Iterable[int],
                        max_local_batch: int | None) -> dict[int, tuple[float, int]]:
    """B -> (predicted step seconds, micro-steps) at N for each batch: what an adaptive
    run ranks its candidates by (samples/s = B / step seconds), from a plan's fitted
    model (`plan.perf`) and its memory bound (`adaptive_memory_bound(plan.meta)`)."""
    return {int(b): accumulated_step_s(params, num_workers, int(b), max_local_batch)
            for b in batches}


def run_step_s(rows: pd.DataFrame, params: perf.PerfParams,
               max_local_batch: int | None) -> dict[int, tuple[float, int]]:
    """B -> (step seconds, micro-steps) of each of N's `rows` (`allowed_rows`) as an
    adaptive run ranks it: a feasible row's predicted step plus the training strategy's
    measured cost per step; a row over the memory bound in accumulated micro-batches
    (`accumulated_step_s`) plus that cost. Other rows, and steps not finite and positive,
    are left out."""
    steps = {}
    for _, row in rows.iterrows():
        batch, extra = int(row["global_batch"]), _strategy_extra_s(row)
        if bool(row["feasible"]):
            step_s, micro = float(row["step_time_s"]), 1
        elif max_local_batch is not None and row["local_batch"] > max_local_batch:
            step_s, micro = accumulated_step_s(params, int(row["num_workers"]), batch,
                                               max_local_batch)
        else:
            continue
        if math.isfinite(step_s + extra) and step_s + extra > 0:
            steps[batch] = (step_s + extra, micro)
    return steps


def _strategy_extra_s(row: pd.Series) -> float:
    """The training strategy's measured cost per step at the row (0 where none)."""
    extra = row.get("strategy_extra_s", 0.0)
    return 0.0 if extra is None or pd.isna(extra) else float(extra)


def adaptive_memory_bound(meta: Mapping) -> int | None:
    """The largest local batch a plan's adaptive rows let a worker hold (None: no bound),
    as the plan recorded it (meta["adaptive_batch"])."""
    return (meta.get("adaptive_batch") or {}).get("max_local_batch")


def memory_bound(oom_local_batch: float, batch_limit_local: int | None,
                 max_local_batch: int | None) -> int | None:
    """The largest local batch that fits: below the smallest one that ran out of memory,
    below the model's own limit, at most the user's bound; None where none is known."""
    bounds = [math.ceil(oom_local_batch) - 1] if math.isfinite(oom_local_batch) else []
    bounds += [] if batch_limit_local is None else [int(batch_limit_local) - 1]
    bounds += [] if max_local_batch is None else [int(max_local_batch)]
    return max(1, min(bounds)) if bounds else None


def reference_samples(epochs: int, dataset_size: int, reference_batch: int) -> float:
    """The work of the plan's epochs at M0, in samples: epochs x floor(D / M0) x M0 (an
    epoch in whole steps, as `accuracy.whole_step_epochs` counts it)."""
    return float(epochs * (dataset_size // reference_batch) * reference_batch)


def seconds_per_sample(step_s: float, global_batch: int, epoch_extra_s: float,
                       dataset_size: int) -> float:
    """The seconds one trained sample costs at B: the step over its B samples, and the
    evaluation and checkpoint of an epoch over that epoch's floor(D / B) x B samples."""
    epoch_samples = (dataset_size // global_batch) * global_batch
    return step_s / global_batch + epoch_extra_s / epoch_samples


@dataclass(frozen=True)
class AdaptiveRun:
    """What `integrate_adaptive_run` predicts: seconds (start-up not included), the
    samples trained at each batch, and the batches in the order the run takes them with
    the progress (reference samples) where each starts."""

    time_s: float
    samples_by_batch: dict[int, float]
    schedule: tuple[tuple[float, int], ...]

    def epochs(self, dataset_size: int) -> float:
        """The epochs trained, an epoch at B being floor(D / B) x B samples (whole steps)."""
        return sum(samples / ((dataset_size // batch) * batch)
                   for batch, samples in self.samples_by_batch.items())

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(batch for _, batch in self.schedule)


def integrate_adaptive_run(cost_per_sample: Mapping[int, float], trajectory: NoiseTrajectory,
                           total_samples: float, reference_batch: int, *,
                           ranking: Mapping[int, float] | None = None,
                           min_gain: float = SWITCH_GAIN_DEFAULT,
                           slices: int = ADAPTIVE_SLICES) -> AdaptiveRun:
    """The adaptive run's seconds: sum over equal slices dp of progress of
    dp / goodput(1 / cost(B), phi, B, M0), B the batch `switched_batch` keeps or takes at
    phi = the trajectory at the slice's middle (the run starts at the best batch) by the
    goodput of `ranking`'s seconds per sample (None: the costs'; the run's own, from
    `run_step_s`, for a plan); the samples it trains are dp / E(B) per slice.
    cost_per_sample: B -> seconds per trained sample (`seconds_per_sample`)."""
    ranking = cost_per_sample if ranking is None else ranking
    edges = np.linspace(0.0, total_samples, slices + 1)
    phis = trajectory.at((edges[:-1] + edges[1:]) / 2)
    current, time_s, samples, schedule = None, 0.0, {}, []
    for start, width, phi in zip(edges[:-1], np.diff(edges), phis):
        rates = {b: goodput(1.0 / cost, float(phi), b, reference_batch)
                 for b, cost in ranking.items()}
        chosen = switched_batch(current, rates, min_gain)
        if chosen != current:
            schedule.append((float(start), int(chosen)))
            current = chosen
        time_s += width / goodput(1.0 / cost_per_sample[current], float(phi), current,
                                  reference_batch)
        trained = width / efficiency(float(phi), current, reference_batch)
        samples[current] = samples.get(current, 0.0) + trained
    return AdaptiveRun(time_s, samples, tuple(schedule))


def fixed_run_time_s(cost_per_sample: float, global_batch: int, trajectory: NoiseTrajectory,
                     total_samples: float, reference_batch: int,
                     slices: int = ADAPTIVE_SLICES) -> float:
    """The seconds of a run kept at B over the same slices as `integrate_adaptive_run`
    (start-up not included): sum of dp x cost(B) / E(B, phi), vectorised."""
    edges = np.linspace(0.0, total_samples, slices + 1)
    phis = trajectory.at((edges[:-1] + edges[1:]) / 2)
    gains = np.array([efficiency(float(phi), global_batch, reference_batch) for phi in phis])
    return float(np.sum(np.diff(edges) * cost_per_sample / gains))


def allowed_rows(table: pd.DataFrame, num_workers: int, dataset_size: int,
                 max_global_batch: int | None) -> pd.DataFrame:
    """N's candidates an adaptive run may train at: those the plan refuses for no memory
    reason (trainable, B at most half the data, not crashed when profiled, within
    max_batch); the others (out of memory, above the bound) accumulate gradients."""
    rows = table[table["num_workers"] == num_workers]
    keep = (rows["trainable"].astype(bool) & (rows["global_batch"] <= dataset_size / 2)
            & (rows["status"] != "error") & (rows["local_batch"] >= 1))
    if max_global_batch is not None:
        keep &= rows["global_batch"] <= max_global_batch
    return rows[keep]
