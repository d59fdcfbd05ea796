"""The adaptive global batch of `tula_ray.train(plan, batch="adaptive")` (issue 44):
the batches it may choose among, from the plan, as its "adaptive at N" row counts them
(`tula_ray.planning.adaptive_batch.allowed_rows`): N's candidates the plan refuses for no
memory reason, each at its predicted step time (eq. 2a plus the training strategy's
measured cost per step), and those over the memory bound in micro-batches
(`accumulated_step_s`). The run starts at the plan's choice. The decisions are
`tula_ray.training.batch_controller`'s, applied by the workers' loop.
"""

from __future__ import annotations

import math

import pandas as pd

from tula_ray.planning.adaptive_batch import (accumulated_step_s, adaptive_memory_bound,
                                              allowed_rows)
from tula_ray.planning.plan import Plan
from tula_ray.training.batch_controller import AdaptiveBatch, BatchOption

BATCH_MODES = ("fixed", "adaptive")


def batch_mode(plan: Plan, batch: str | None) -> str:
    """`batch`, or by default what the plan chose: "adaptive" for an adaptive choice
    (`Choice.adaptive`: the plan's time to accuracy is that run's), else "fixed"."""
    if batch is not None:
        return batch
    return "adaptive" if plan.choice.adaptive else "fixed"


def adaptive_batch_of(plan: Plan, num_workers: int, start: int) -> AdaptiveBatch:
    """The batches an adaptive run at `num_workers` may train, from `start` (the plan's
    choice, or the global batch given)."""
    options = [option for option in _options(plan, num_workers)
               if math.isfinite(option.step_time_s) and option.step_time_s > 0]
    batches = sorted(option.global_batch for option in options)
    if start not in batches:
        raise ValueError(f"an adaptive batch starts at a candidate of the plan at "
                         f"N={num_workers} that it may train: {batches}; B={start} is not one")
    reference = int(plan.meta.get("reference_batch") or min(batches))
    return AdaptiveBatch(options, reference_batch=reference, start=start)


def _options(plan: Plan, num_workers: int) -> list[BatchOption]:
    """Each allowed B's step: the plan's prediction where it is feasible, else (over the
    memory bound) accumulated micro-batches; the strategy's cost per step added."""
    rows = allowed_rows(plan.table, num_workers, plan.dataset_size, None)
    bound = adaptive_memory_bound(plan.meta)
    options = []
    for _, row in rows.iterrows():
        batch, extra = int(row["global_batch"]), _extra_s(row)
        if bool(row["feasible"]):
            options.append(BatchOption(batch, float(row["step_time_s"]) + extra))
        elif bound is not None and row["local_batch"] > bound:
            step_s, micro = accumulated_step_s(plan.perf, num_workers, batch, bound)
            options.append(BatchOption(batch, step_s + extra, micro))
    return options


def _extra_s(row: pd.Series) -> float:
    """The training strategy's measured cost per step at the row (0 where none)."""
    extra = row.get("strategy_extra_s", 0.0)
    return 0.0 if extra is None or pd.isna(extra) else float(extra)
