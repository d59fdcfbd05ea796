"""The adaptive global batch of `tula_ray.train(plan, batch="adaptive")` (issue 44):
the batches it may choose among, from the plan. The candidates of the plan's N that it
found feasible, each with its predicted step time at N (eq. 2a, plus the training
strategy's measured cost per step), starting at the plan's choice. The decisions are
`tula_ray.training.batch_controller`'s, applied by the workers' loop.
"""

from __future__ import annotations

import math

from tula_ray.planning.plan import Plan
from tula_ray.training.batch_controller import AdaptiveBatch, BatchOption

BATCH_MODES = ("fixed", "adaptive")


def adaptive_batch_of(plan: Plan, num_workers: int, start: int) -> AdaptiveBatch:
    """The plan's feasible candidates at `num_workers`, their predicted step times, from
    `start` (the plan's choice, or the global batch given)."""
    table = plan.table
    rows = table[(table["num_workers"] == num_workers) & table["feasible"].astype(bool)]
    extra = rows["strategy_extra_s"].fillna(0.0) if "strategy_extra_s" in rows else 0.0
    step_s = rows["step_time_s"] + extra
    options = [BatchOption(int(batch), float(seconds))
               for batch, seconds in zip(rows["global_batch"], step_s)
               if math.isfinite(seconds) and seconds > 0]
    batches = sorted(option.global_batch for option in options)
    if start not in batches:
        raise ValueError(f"an adaptive batch starts at a feasible candidate of the plan at "
                         f"N={num_workers}: {batches}; B={start} is not one")
    reference = int(plan.meta.get("reference_batch") or min(batches))
    return AdaptiveBatch(options, reference_batch=reference, start=start)
