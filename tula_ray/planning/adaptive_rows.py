"""The plan's adaptive rows and their place in the choice (issue 44, item 2).

`adaptive_rows` writes, for every cluster size N of the plan's table, the row "adaptive at
N": the run the model of `tula_ray.planning.adaptive_batch` predicts over the plan's noise
scale trajectory (`tula_ray.planning.noise_trajectory`), its time and cost to the target
and the epochs it trains, beside the best fixed batch of N under the same trajectory (what
adapting gains, or loses: the row switches where the run would, `run_step_s`). The rows
live in `Plan.adaptive`, not in `Plan.table`: the table stays one row per (N, B)
candidate for every reader of it.

`choose_adaptive`: under `time_to_accuracy` or `cost_to_accuracy` (`ADAPTIVE_OBJECTIVES`),
the fastest (cheapest) adaptive row replaces the policy's fixed choice where it is
strictly better; the Choice then says `adaptive` and its `global_batch` is the batch the
run starts at. The knee objectives bend a curve over B, which an adaptive run is not on,
and the per-epoch objectives count no target: both keep the fixed rows. Core: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from tula_ray.models import memory as memory_model, perf
from tula_ray.models.goodput import SWITCH_GAIN_DEFAULT
from tula_ray.models.pricing import NodeBilling
from tula_ray.planning.accuracy import ProfiledNoise
from tula_ray.planning.adaptive_batch import (ADAPTIVE_SLICES, AdaptiveRun, allowed_rows,
                                              fixed_run_time_s, integrate_adaptive_run,
                                              reference_samples, run_step_s,
                                              seconds_per_sample)
from tula_ray.planning.context import PlanContext
from tula_ray.planning.noise_trajectory import NoiseTrajectory, noise_trajectory
from tula_ray.planning.policy import OBJECTIVE_METRICS, Choice
from tula_ray.planning.target_costs import per_epoch_to_target

ADAPTIVE_OBJECTIVES = ("time_to_accuracy", "cost_to_accuracy")
# An adaptive row replaces the fixed choice only when better by more than this (relative):
# where the trajectory is constant it is at best the best fixed batch, and then the fixed
# run, which needs no switching, is the choice.
ADAPTIVE_MIN_GAIN = 1e-9


def _batch_costs(rows: pd.DataFrame, context: PlanContext,
                 steps: dict[int, tuple[float, int]],
                 memory: memory_model.MemoryParams | None) -> dict[int, tuple[float, int, float]]:
    """B -> (seconds per trained sample, micro-steps, peak bytes) of N's allowed rows that
    the run may train (`steps`: `run_step_s`): a row the plan may choose at its own
    estimate (its time to accuracy's per-epoch part over the samples of its epochs); one
    above the memory bound at its accumulated step, with its epoch's evaluation and
    checkpoint (a run to a target's evaluations instead, where the rows price them:
    `target_costs`)."""
    costs = {}
    per_epoch, _ = per_epoch_to_target(
        rows, (rows["estimated_total_time_s"] - rows["startup_time_s"]) / context.epochs)
    extras = rows["target_extra_s"] if "target_extra_s" in rows else \
        rows["eval_time_s"] + rows["checkpoint_time_s"]
    for position, (_, row) in enumerate(rows.iterrows()):
        batch = int(row["global_batch"])
        if batch not in steps:
            continue
        if row["feasible"]:
            costs[batch] = (per_epoch[position] / ((context.dataset_size // batch) * batch), 1,
                            float(row["estimated_peak_mem_bytes"]))
        else:
            step, micro = steps[batch]
            extra = float(extras.iloc[position])
            peak = (math.nan if memory is None else
                    float(memory_model.predict_peak_bytes(memory, row["local_batch"] / micro)))
            costs[batch] = (seconds_per_sample(step, batch, extra, context.dataset_size),
                            micro, peak)
    return costs


def _best_fixed(costs: dict[int, tuple[float, int, float]], trajectory: NoiseTrajectory,
                total: float, reference_batch: int) -> tuple[int, float]:
    """(B, seconds) of the fastest batch that needs no accumulation, kept throughout."""
    fixed = {b: fixed_run_time_s(cost, b, trajectory, total, reference_batch)
             for b, (cost, micro, _) in costs.items() if micro == 1}
    if not fixed:
        return 0, math.nan
    batch = min(fixed, key=fixed.get)
    return batch, fixed[batch]


def _row(num_workers: int, run: AdaptiveRun, costs: dict[int, tuple[float, int, float]],
         startup_s: float, test_pass_s: dict[int, float], fixed: tuple[int, float],
         trajectory: NoiseTrajectory, dataset_size: int) -> dict:
    """The adaptive row of N (cost added by the caller). test_pass_s: B -> the test pass
    that a run to a target ending at B reads once (`target_costs`; none: not priced)."""
    start, final = run.batches[0], run.batches[-1]
    return {"num_workers": num_workers, "global_batch": start,
            "local_batch": start // num_workers, "adaptive": True, "feasible": True,
            "batches": " > ".join(str(b) for b in run.batches),
            "switches": len(run.batches) - 1, "final_batch": run.batches[-1],
            "accumulation_steps": max(costs[b][1] for b in run.batches),
            "noise_scale_start": trajectory.noise_scale[0],
            "noise_scale_end": trajectory.noise_scale[-1],
            "epochs_to_target": run.epochs(dataset_size),
            "time_to_accuracy_s": run.time_s + startup_s + test_pass_s.get(final, 0.0),
            "startup_time_s": startup_s,
            "estimated_peak_mem_bytes": float(np.nanmax([costs[b][2] for b in run.batches]))
            if any(np.isfinite(costs[b][2]) for b in run.batches) else math.nan,
            "fixed_batch": fixed[0],
            "fixed_time_to_accuracy_s": fixed[1] + startup_s + test_pass_s.get(fixed[0], 0.0)}


def adaptive_rows(estimates: pd.DataFrame, context: PlanContext, trajectory: NoiseTrajectory,
                  params: perf.PerfParams, memory: memory_model.MemoryParams | None,
                  billing: NodeBilling, bound: int | None) -> pd.DataFrame:
    """One row per cluster size N of `estimates` (the plan's table with its estimates):
    the adaptive run at N over `trajectory`, within the memory `bound` on the local batch
    (above it, accumulated; None: no bound known). No row for an N the user's max_workers
    excludes, or with no batch to train at."""
    total = reference_samples(context.epochs, context.dataset_size, context.reference_batch)
    rows = []
    for n in sorted(estimates["num_workers"].unique()):
        if context.max_workers is not None and n > context.max_workers:
            continue
        allowed = allowed_rows(estimates, n, context.dataset_size, context.max_global_batch)
        # The run ranks its batches by its own steps (`run_step_s`); the row counts time
        # as the fixed rows do: with the same ranking it predicts the run's switches.
        steps = run_step_s(allowed, params, bound)
        costs = _batch_costs(allowed, context, steps, memory)
        if not costs:
            continue
        run = integrate_adaptive_run({b: c for b, (c, _, _) in costs.items()}, trajectory,
                                     total, context.reference_batch,
                                     ranking={b: step_s / b for b, (step_s, _) in steps.items()})
        fixed = _best_fixed(costs, trajectory, total, context.reference_batch)
        test_pass = dict(zip(allowed["global_batch"].astype(int), allowed["eval_time_s"])) \
            if "target_extra_s" in allowed else {}
        rows.append(_row(int(n), run, costs, float(allowed["startup_time_s"].iloc[0]),
                         test_pass, fixed, trajectory, context.dataset_size))
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["cost_to_accuracy_usd"] = billing.cost_usd(
            frame["time_to_accuracy_s"].to_numpy(float), frame["num_workers"].to_numpy(float),
            frame["estimated_peak_mem_bytes"].to_numpy(float))
    return frame


def choose_adaptive(choice: Choice, estimates: pd.DataFrame, adaptive: pd.DataFrame,
                    objective: str, enabled: bool = True) -> Choice:
    """`choice`, or the adaptive row that beats it under an `ADAPTIVE_OBJECTIVES`
    objective (module docstring); a choice that fell back to another objective (the noise
    checks') stays. enabled False: the context's `adaptive_batch` off."""
    if (not enabled or objective not in ADAPTIVE_OBJECTIVES or choice.objective != objective
            or adaptive.empty):
        return choice
    metric = OBJECTIVE_METRICS[objective]
    fixed = float(estimates.loc[(estimates["num_workers"] == choice.num_workers)
                                & (estimates["global_batch"] == choice.global_batch),
                                metric].iloc[0])
    best = adaptive.loc[adaptive[metric].idxmin()]
    if not float(best[metric]) < fixed * (1.0 - ADAPTIVE_MIN_GAIN):
        return choice
    n, start = int(best["num_workers"]), int(best["global_batch"])
    reason = (f"adaptive batch at N={n} ({best['batches']}): {metric} {best[metric]:.4g} "
              f"against {fixed:.4g} at the fixed N={choice.num_workers}, "
              f"B={choice.global_batch} ({choice.reason}); it starts at B={start} and "
              "switches as the noise scale trajectory grows")
    return replace(choice, num_workers=n, global_batch=start, reason=reason, adaptive=True,
                   ties=(), tie_break="", knee_global_batch=None)


def adaptive_prediction(estimates: pd.DataFrame, profiles: pd.DataFrame,
                        noise: ProfiledNoise, context: PlanContext, params: perf.PerfParams,
                        memory: memory_model.MemoryParams | None, billing: NodeBilling,
                        bound: int | None) -> tuple[pd.DataFrame, NoiseTrajectory | None]:
    """The plan's adaptive rows (`adaptive_rows`) over the noise scale's trajectory
    (`noise_trajectory`, over the work of the plan's epochs at M0); none, and no
    trajectory, where the plan has no finite phi."""
    total = reference_samples(context.epochs, context.dataset_size, context.reference_batch)
    trajectory = noise_trajectory(profiles, noise, total, context.dataset_size)
    if trajectory is None:
        return pd.DataFrame(), None
    return (adaptive_rows(estimates, context, trajectory, params, memory, billing, bound),
            trajectory)


def adaptive_meta(trajectory: NoiseTrajectory | None, bound: int | None) -> dict[str, Any]:
    """What the plan records of its adaptive rows: the trajectory they integrate over and
    the memory bound above which they accumulate (nothing without a trajectory)."""
    if trajectory is None:
        return {}
    return {"noise_trajectory": trajectory.to_dict(),
            "adaptive_batch": {"max_local_batch": bound, "min_gain": SWITCH_GAIN_DEFAULT,
                               "slices": ADAPTIVE_SLICES}}
