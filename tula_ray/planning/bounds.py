"""The search's bounds on its batches (DESIGN "Data flow" steps 1-2), from what the memory
probe measured: eq. 3 fitted on the probe's peaks, one device's memory budget, the cap on
B (max_batch and the dataset), the bound check's refit, and the candidates up to the bound.

Core: no Ray. `trainables.memory_probe` measures on a worker and fills `MemoryProbe`;
the decisions on what it measured are here, so they are tested with made-up peaks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tula_ray.failures import UserCodeError
from tula_ray.models import memory as memory_model
from tula_ray.models.batch_limit import (BatchLimit, checked_max_local_batch,
                                         measured_max_local_batch)
from tula_ray.space import SearchSpace

if TYPE_CHECKING:  # what the probe's worker filled in; torch is not needed to plan
    from tula_ray.workloads import Workload
    from tula_ray.workloads.check import WorkloadFacts

logger = logging.getLogger(__name__)


@dataclass
class MemoryProbe:
    """What the memory probe learned (DESIGN step 1), one type for a fresh search and a
    resumed one: a saved search restores `params`, `rows`, `max_local_batch` and
    `batch_limit`; the rest belongs to the run that measured them (None after a restore)."""

    params: memory_model.MemoryParams  # eq. 3 on the probe's peaks (and the bound checks')
    rows: list[dict[str, Any]]  # per local batch: peak_mem_bytes, predicted_peak_mem_bytes
    max_local_batch: int | None = None  # the checked bound (`checked_bound`)
    bound_checks: list[dict[str, Any]] = field(default_factory=list)  # local_batch, peak
    # The smallest local batch the workload's own code refused, and its error; None: none.
    batch_limit: BatchLimit | None = None
    refused: dict[int, str] = field(default_factory=dict)  # b -> error: a probe batch refused
    workload: Workload | None = None  # completed on the worker (shapes, dtype, size)
    facts: WorkloadFacts | None = None
    device_memory_bytes: float | None = None  # the GPU's size; None on CPU
    device_in_use_bytes: float = 0.0  # what the device holds besides the model (CUDA context)
    static: memory_model.StaticMemory | None = None  # eq. 3's static terms
    # Optimizer state the training strategy's optimizer keeps beyond the workload's, which
    # the probe's steps ran (`probe_task.strategy_state_bytes`): off the budget. 0: none.
    strategy_state_bytes: float = 0.0
    # The peak of evaluating one batch of the workload's declared eval_batch
    # (`probe_task.evaluation_peak_or_none`; `check_evaluation_fits`): None when it
    # declares none (evaluation at b: the probe's step at b covers it), or when the pass
    # did not fit the device (with eval_batch declared).
    eval_peak_bytes: float | None = None
    input_bytes_per_sample: float | None = None  # what a refit needs
    # The driver's seconds for the task less its measuring: the workload's check alone,
    # which `train` runs again before its worker group starts (a part of its start-up).
    check_s: float | None = None


@dataclass(frozen=True)
class SearchBounds:
    """A search's candidates up to the bound, the probe that bounded them, and one
    device's memory budget: what a fresh search measures and a resumed one restores."""

    space: SearchSpace
    probe: MemoryProbe
    device_memory_bytes: float


def probe_min_local_batch(min_batch: int, cluster_sizes: Sequence[int]) -> int:
    """The probe's smallest local batch: min_batch over the largest N (its smallest b)."""
    return max(1, min_batch // max(cluster_sizes))


def fitted_probe(measured: Mapping[str, Any], check_s: float | None = None) -> MemoryProbe:
    """Eq. 3 fitted on what the probe measured on a worker (`measure.probe_peaks`'s
    local_batches, peaks, refused, static, input_bytes_per_sample, and the check's
    workload and facts); a UserCodeError when fewer than two of its batches ran."""
    points = list(zip(measured["local_batches"], measured["peaks"]))
    if len(points) < 2:  # eq. 3 needs two batches the model runs
        error = next(iter(measured["refused"].values()))
        raise UserCodeError(
            f"{error}, while local batch {points[0][0]} ran: the memory probe needs two "
            "batches the model runs. Lower min_batch (the probe measures min_batch / the "
            f"largest N, x {', '.join(map(str, memory_model.PROBE_BATCH_FACTORS))})")
    params = memory_model.fit_probe(points, measured["static"],
                                    measured["input_bytes_per_sample"])
    return MemoryProbe(params, memory_model.peak_rows(params, points),
                       workload=measured["workload"], facts=measured["facts"],
                       device_memory_bytes=measured["device_memory_bytes"],
                       device_in_use_bytes=measured["device_in_use_bytes"],
                       static=measured["static"],
                       input_bytes_per_sample=measured["input_bytes_per_sample"],
                       check_s=check_s, refused=measured["refused"],
                       strategy_state_bytes=measured.get("strategy_state_bytes", 0.0),
                       eval_peak_bytes=measured.get("eval_peak_bytes"))


def memory_budget_bytes(probe: MemoryProbe, *, declared_gb: float | None, num_workers: int,
                        use_gpu: bool, cpu_share_bytes: float) -> float:
    """One device's bytes for eq. 3's M_total: the user's declared size, else the GPU the
    probe ran on, else `cpu_share_bytes` (a CPU worker's share of its node's RAM); less
    what the probe (one process, no DDP) cannot see: the CUDA context, DDP's gradient
    buckets and NCCL's buffers (`memory.device_budget_bytes`). Budgeted for the largest N
    (`num_workers`), so it holds for every N. The training strategy's optimizer state
    beyond the workload's (`probe.strategy_state_bytes`: the probe's steps ran the
    workload's optimizer, `train` runs the strategy's) is taken off too."""
    if declared_gb is not None:
        device_bytes = declared_gb * 1e9
    else:
        device_bytes = probe.device_memory_bytes or cpu_share_bytes
    return memory_model.device_budget_bytes(
        device_bytes, grad_bytes=probe.static.grad_bytes, num_workers=num_workers,
        in_use_bytes=probe.device_in_use_bytes, nccl=use_gpu,
        strategy_state_bytes=probe.strategy_state_bytes)


def check_evaluation_fits(probe: MemoryProbe, device_bytes: float, *, headroom: float) -> None:
    """A ValueError when the workload's declared eval_batch does not fit one device: its
    evaluation's measured peak (`probe.eval_peak_bytes`: the model, the last step's
    gradients and the optimizer's state, then a forward pass of eval_batch samples) above
    the budget less the headroom, or a pass that did not fit the device. Every candidate
    evaluates at that batch whatever its own (the peak does not depend on b), so no
    candidate could run: the search stops before any trial."""
    eval_batch = probe.workload.eval_batch if probe.workload is not None else None
    if eval_batch is None:
        return
    limit, peak = device_bytes * (1 - headroom), probe.eval_peak_bytes
    if peak is not None and peak <= limit:
        return
    needs = "does not fit the device's memory" if peak is None else \
        f"needs {peak / 1e9:.3g} GB"
    raise ValueError(
        f"eval_batch={eval_batch} does not fit: evaluating one batch on a worker {needs} "
        f"(the model, its gradients and optimizer state, and a forward pass of {eval_batch} "
        f"samples), and the memory budget allows {limit / 1e9:.3g} GB ({device_bytes / 1e9:.3g}"
        f" GB, headroom {headroom:.0%}); lower the workload's eval_batch or declare more "
        "memory")


def largest_global_batch(max_batch: int | None, dataset_size: int) -> int:
    """The cap on B before memory: the user's max_batch, never above the dataset."""
    return min(max_batch or dataset_size, dataset_size)


def candidate_space(cluster_sizes: Sequence[int], *, min_batch: int, max_batch: int | None,
                    dataset_size: int) -> SearchSpace:
    """Every candidate up to the cap (`largest_global_batch`), before the memory bound:
    the bound check measures up to its largest local batch (its largest B over the
    smallest N), never above."""
    return SearchSpace.build(cluster_sizes, min_batch=min_batch,
                             max_batch=largest_global_batch(max_batch, dataset_size))


def checked_bound(probe: MemoryProbe, measure_peak: Callable[[int], float | None],
                  device_bytes: float, *, headroom: float, space: SearchSpace,
                  doubling: bool = False) -> MemoryProbe:
    """The probe's bound found by measuring (`measure_peak(b)`: the peak at local batch b,
    None when out of memory, a UserCodeError when the workload's code refuses b), up to
    the largest local batch of `space`'s candidates, with the model's own limit when its
    code refuses a batch (logged as a warning):
    - doubling (a GPU): b doubled until a step fails, then bisected to within 5 %
      (`batch_limit.measured_max_local_batch`), about log2(bound / probe's b) + 5 steps;
    - else (a CPU, where a step at a large b is slow and memory a share of RAM): eq. 3's
      bound checked with at most 3 steps near it (`batch_limit.checked_max_local_batch`).
    Then eq. 3 and its curve refitted on every measured peak, so the plan's memory
    predictions cover large batches too. Updates and returns `probe`."""
    measured = [(row["local_batch"], row["peak_mem_bytes"]) for row in probe.rows]
    local_batches = [c.local_batch for c in space.candidates()]
    if doubling:
        bound, checks, limit = measured_max_local_batch(
            measure_peak, device_bytes, local_batches=local_batches, headroom=headroom,
            measured=measured, refused=probe.refused)
    else:
        bound, checks, limit = checked_max_local_batch(
            probe.params, measure_peak, device_bytes, local_batches=local_batches,
            headroom=headroom, measured=measured, refused=probe.refused)
    points = measured + [(b, peak) for b, peak in checks if peak is not None]
    if checks:
        probe.params = memory_model.fit_probe(points, probe.static, probe.input_bytes_per_sample)
    probe.rows = [{**row, "bound_check": i >= len(measured)}
                  for i, row in enumerate(memory_model.peak_rows(probe.params, points))]
    probe.bound_checks = [{"local_batch": b, "peak_mem_bytes": peak} for b, peak in checks]
    probe.max_local_batch, probe.batch_limit = bound, limit
    if limit is not None:
        logger.warning("%s", limit.warning(bound, space.cluster_sizes[0]))
    return probe


def bounded_space(candidates: SearchSpace, max_local_batch: int, *, min_batch: int,
                  device_bytes: float, headroom: float) -> SearchSpace:
    """The candidates (`candidate_space`: none above the cap) whose B the largest N holds
    at `max_local_batch`; a ValueError when even min_batch does not fit."""
    bound = max_local_batch * candidates.cluster_sizes[-1]
    if bound < min_batch:
        raise ValueError(
            f"min_batch={min_batch} does not fit: the memory model allows at most a local "
            f"batch of {max_local_batch} ({device_bytes / 1e9:.3g} GB device memory, headroom "
            f"{headroom:.0%}), so B <= {bound}; lower min_batch or declare more memory")
    return candidates.bounded(max_local_batch)
