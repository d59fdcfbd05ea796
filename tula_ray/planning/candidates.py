"""The plan's table of candidates before the choice: what the models predict for every
(N, B) of the space (`estimates.predict_candidates`), what was measured beside it, and
which candidates the plan may choose (`infeasible_reason`, in the order it asks). Core:
no Ray; `plan.build_plan` assembles the plan from it.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from tula_ray.models import memory as memory_model, perf
from tula_ray.models.batch_limit import BatchLimit
from tula_ray.models.pricing import NodeBilling
from tula_ray.planning.context import PlanContext
from tula_ray.planning.estimates import EpochCosts, StepExtra, add_epoch_times, predict_candidates
from tula_ray.profile_table import oom_local_batch
from tula_ray.space import SearchSpace

UNTRAINABLE = "the training strategy cannot train it: "  # infeasible_reason's prefix
# The profile's fields kept beside the prediction, as measured_* (status and error as they are)
MEASURED_COLUMNS = {"step_time_s": "measured_step_time_s",
                    "peak_mem_bytes": "measured_peak_mem_bytes",
                    "compute_time_s": "measured_compute_time_s",
                    "sync_time_s": "measured_sync_time_s"}


def candidate_table(space: SearchSpace, profiles: pd.DataFrame, params: perf.PerfParams,
                    memory: memory_model.MemoryParams | None, billing: NodeBilling,
                    costs: EpochCosts, extra: StepExtra | None, context: PlanContext
                    ) -> pd.DataFrame:
    """One row per candidate of `space`: eq. 2, 4a, 3 and 4b predicted (the training
    strategy's `extra` per step, none where it trains plain steps), whether it trains plain
    steps, and beside them what was measured (measured_*, status, error, source, the
    measured epoch times and the step time's relative error)."""
    grid = pd.DataFrame([c.as_dict() for c in space.candidates()])
    plain_steps = set(context.plain_steps)
    table = predict_candidates(grid, params, memory, billing, context.epochs,
                               context.dataset_size, strategy_extra=extra, costs=costs,
                               plain_steps=plain_steps)
    table["plain_steps"] = [(int(n), int(b)) in plain_steps
                            for n, b in zip(table["num_workers"], table["global_batch"])]
    measured = profiles.rename(columns=MEASURED_COLUMNS)
    keep = ["num_workers", "global_batch", "measured_step_time_s", "measured_compute_time_s",
            "measured_sync_time_s", "measured_peak_mem_bytes", "status", "error"]
    table = table.merge(measured[keep], on=["num_workers", "global_batch"], how="left")
    table["source"] = np.where(table["status"].isna(), "predicted", "measured")
    table["status"] = table["status"].fillna("")
    table["error"] = table["error"].fillna("")
    add_epoch_times(table, "measured_step_time_s", context.epochs, context.dataset_size,
                    costs, prefix="measured_")
    table["step_time_rel_error"] = (
        (table["step_time_s"] - table["measured_step_time_s"]).abs()
        / table["measured_step_time_s"])
    return table


def add_feasibility(table: pd.DataFrame, profiles: pd.DataFrame, context: PlanContext,
                    batch_limit: BatchLimit | None) -> float:
    """The table's steps_per_epoch, samples_dropped, infeasible_reason, feasible and
    trainable columns. Returns the smallest local batch that ran out of memory when
    profiled (inf: none), where the dense curve stops too."""
    oom_bound = oom_local_batch(profiles)
    untrainable, dataset_size = context.refused, context.dataset_size
    # drop_last: each epoch is D // B steps, and the rest of the samples is not seen
    table["steps_per_epoch"] = dataset_size // table["global_batch"]
    table["samples_dropped"] = dataset_size - table["steps_per_epoch"] * table["global_batch"]
    reasons = [infeasible_reason(row, oom_bound, context.max_local_batch, context.max_workers,
                                 context.max_global_batch, untrainable, dataset_size,
                                 batch_limit)
               for _, row in table.iterrows()]
    table["infeasible_reason"] = reasons
    table["feasible"] = table["infeasible_reason"] == ""
    table["trainable"] = [(int(n), int(b)) not in untrainable
                          for n, b in zip(table["num_workers"], table["global_batch"])]
    return oom_bound


def infeasible_reason(row: pd.Series, oom_local_batch: float, max_local_batch: int | None,
                      max_workers: int | None, max_global_batch: int | None,
                      untrainable: Mapping[tuple[int, int], str], dataset_size: int,
                      batch_limit: BatchLimit | None = None) -> str:
    """Why the plan may not choose the candidate `row` ("" when it may): the training
    strategy refuses it, B is above half the data, profiling crashed or ran out of memory
    at its local batch or below, the model's own limit, the memory bound, the user's
    max_workers or max_batch; the first that applies."""
    refused = untrainable.get((int(row["num_workers"]), int(row["global_batch"])))
    if refused:
        return f"{UNTRAINABLE}{refused}"
    if row["global_batch"] > dataset_size / 2:
        return (f"B above half the training set: {int(row['steps_per_epoch'])} step(s) per "
                f"epoch, {int(row['samples_dropped'])} of {dataset_size} samples dropped "
                "every epoch")
    if row["status"] == "error":
        return "profiling crashed"
    if row["local_batch"] >= oom_local_batch:
        return "out of memory when profiled"
    if batch_limit is not None and row["local_batch"] >= batch_limit.local_batch:
        return batch_limit.reason()
    if max_local_batch is not None and row["local_batch"] > max_local_batch:
        return f"local batch above the memory bound {max_local_batch}"
    if max_workers is not None and row["num_workers"] > max_workers:
        return f"more than max_workers={max_workers}"
    if max_global_batch is not None and row["global_batch"] > max_global_batch:
        return f"above max_batch={max_global_batch}"
    return ""
