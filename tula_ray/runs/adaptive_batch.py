"""The adaptive global batch of `tula_ray.train(plan, batch="adaptive")` (issue 44):
the batches it may choose among, from the plan, as its "adaptive at N" row ranks them
(`tula_ray.planning.adaptive_batch.run_step_s`): N's candidates the plan refuses for no
memory reason (`allowed_rows`), each at its predicted step time (eq. 2a plus the training
strategy's measured cost per step), and those over the memory bound in micro-batches
(`accumulated_step_s`). The run starts at the plan's choice. The decisions are
`tula_ray.training.batch_controller`'s, applied by the workers' loop.
"""

from __future__ import annotations

from tula_ray.planning.adaptive_batch import adaptive_memory_bound, allowed_rows, run_step_s
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
    options = _options(plan, num_workers)
    batches = sorted(option.global_batch for option in options)
    if start not in batches:
        raise ValueError(f"an adaptive batch starts at a candidate of the plan at "
                         f"N={num_workers} that it may train: {batches}; B={start} is not one")
    reference = int(plan.meta.get("reference_batch") or min(batches))
    return AdaptiveBatch(options, reference_batch=reference, start=start)


def _options(plan: Plan, num_workers: int) -> list[BatchOption]:
    """Each allowed B's step as the plan's adaptive row ranks it (`run_step_s`), within
    the user's max_batch as the row is."""
    most = (plan.meta.get("plan_context") or {}).get("max_global_batch")
    rows = allowed_rows(plan.table, num_workers, plan.dataset_size, most)
    steps = run_step_s(rows, plan.perf, adaptive_memory_bound(plan.meta))
    return [BatchOption(batch, step_s, micro) for batch, (step_s, micro) in steps.items()]
