"""The workload check and the memory probe (DESIGN step 1) as Ray tasks on one worker.

Each task takes one worker's resources (a whole GPU when the workers have GPUs), so the
check runs where the workers will (the driver may be a CPU head without the data, the
GPU or the packages), and the peaks and the device size are the workers', not the
driver's. The checking is `tula_ray.workloads.check`, the measuring
`tula_ray.training.measure.probe_peaks` / `peak_or_none`, the fitting `tula_ray.models.memory` (eq. 3):
this module only ships them to a worker. An error raised there (the workload's own code
as a `UserCodeError` with the worker's traceback, or a ValueError naming a bad field)
is raised again in the driver as it is, before any worker group starts; but a batch the
workload's code refuses once a smaller one ran is the model's own limit, a bound
(`tula_ray.models.batch_limit`), and the search goes on below it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray
from ray.exceptions import RaySystemError, RayTaskError

from tula_ray.cluster import task_options
from tula_ray.failures import UserCodeError
from tula_ray.models import memory as memory_model
from tula_ray.models.batch_limit import BatchLimit, checked_max_local_batch
from tula_ray.space import SearchSpace
from tula_ray.training import measure
from tula_ray.training.measure import Example
from tula_ray.workloads import Workload, resolve_workload
from tula_ray.workloads.check import WorkloadFacts, complete, inspect_workload

logger = logging.getLogger(__name__)


def _device(use_gpu: bool) -> str:
    return "cuda" if use_gpu else "cpu"


def _check_and_measure(workload: str | Workload, options: dict[str, Any],
                       local_batches: list[int], use_gpu: bool) -> dict[str, Any]:
    resolved = resolve_workload(workload, options)
    facts = inspect_workload(resolved, _device(use_gpu))
    completed = complete(resolved, facts)  # a contradicted declaration fails here
    started = time.perf_counter()
    measured = measure.probe_peaks(completed, local_batches, _device(use_gpu),
                                   example=facts.example) if local_batches else {}
    return {"facts": facts, "workload": completed, **measured,
            "measure_s": time.perf_counter() - started}


def _peak_on_worker(workload: Workload, local_batch: int, use_gpu: bool,
                    example: Example) -> float | None:
    return measure.peak_or_none(workload, local_batch, _device(use_gpu), example)


def _on_one_worker(function: Callable, resources: dict[str, float]):
    """`function` as a Ray task holding one worker's `resources`."""
    return ray.remote(**task_options(resources))(function)


# How a worker that cannot unpickle the workload (a module only the driver has) reads.
UNIMPORTABLE_TEXTS = ("ModuleNotFoundError", "ImportError", "Can't get attribute")


def _get(reference: ray.ObjectRef, workload: str | Workload) -> Any:
    """ray.get, raising the task's own error in the driver when it is the workload's
    (UserCodeError: its text holds the worker's traceback) or a bad field (ValueError,
    TypeError); a workload the worker cannot even unpickle (its functions come from a
    module the driver has and the workers lack) as a UserCodeError that says so; anything
    else (a lost worker or node) as Ray raised it."""
    try:
        return ray.get(reference)
    except RayTaskError as error:
        if isinstance(error.cause, (UserCodeError, ValueError, TypeError)):
            raise error.cause from None
        text = str(error)
        if isinstance(error.cause, RaySystemError) and any(t in text for t in UNIMPORTABLE_TEXTS):
            name = workload if isinstance(workload, str) else workload.name
            raise UserCodeError(
                f"workload {name!r} cannot be rebuilt in a Ray worker: a module its functions "
                "come from is missing there (the driver has it, the workers do not). Ship it "
                "with runtime_env={'py_modules': [...]} or {'working_dir': ...} (on the "
                "command line, --runtime-env-json), or install it on every node",
                text) from None
        raise


def check_workload(workload: str | Workload, options: dict[str, Any], *,
                   resources: dict[str, float], use_gpu: bool) -> Workload:
    """The workload checked on one worker (`tula_ray.workloads.check`), completed (shapes,
    dtype, size)."""
    return _get(_on_one_worker(_check_and_measure, resources).remote(
        workload, options, [], use_gpu), workload)["workload"]


def timed_check_workload(workload: str | Workload, options: dict[str, Any], *,
                         resources: dict[str, float], use_gpu: bool) -> tuple[Workload, float]:
    """`check_workload` and the seconds it took the driver: what `train` waits for before
    its worker group starts."""
    started = time.perf_counter()
    checked = check_workload(workload, options, resources=resources, use_gpu=use_gpu)
    return checked, time.perf_counter() - started


@dataclass
class MemoryProbe:
    """What the memory probe learned (DESIGN step 1), one type for a fresh search and a
    resumed one: a saved search restores `params`, `rows`, `max_local_batch` and
    `batch_limit`; the rest belongs to the run that measured them (None after a restore)."""

    params: memory_model.MemoryParams  # eq. 3 on the probe's peaks (and the bound checks')
    rows: list[dict[str, Any]]  # per local batch: peak_mem_bytes, predicted_peak_mem_bytes
    max_local_batch: int | None = None  # the checked bound (`check_max_local_batch`)
    bound_checks: list[dict[str, Any]] = field(default_factory=list)  # local_batch, peak
    # The smallest local batch the workload's own code refused, and its error; None: none.
    batch_limit: BatchLimit | None = None
    refused: dict[int, str] = field(default_factory=dict)  # b -> error: a probe batch refused
    workload: Workload | None = None  # completed on the worker (shapes, dtype, size)
    facts: WorkloadFacts | None = None
    device_memory_bytes: float | None = None  # the GPU's size; None on CPU
    device_in_use_bytes: float = 0.0  # what the device holds besides the model (CUDA context)
    static: memory_model.StaticMemory | None = None  # eq. 3's static terms
    input_bytes_per_sample: float | None = None  # what a refit needs
    # The driver's seconds for the task less its measuring: the workload's check alone,
    # which `train` runs again before its worker group starts (a part of its start-up).
    check_s: float | None = None


def probe_memory(workload: str | Workload, options: dict[str, Any], *, min_local_batch: int,
                 resources: dict[str, float], use_gpu: bool) -> MemoryProbe:
    """Check the workload and measure peaks on one worker, then fit the memory model."""
    started = time.perf_counter()
    measured = _get(_on_one_worker(_check_and_measure, resources).remote(
        workload, options, memory_model.probe_batches(min_local_batch), use_gpu), workload)
    check_s = time.perf_counter() - started - measured["measure_s"]
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
                       check_s=check_s, refused=measured["refused"])


def check_max_local_batch(probe: MemoryProbe, device_bytes: float, *, headroom: float,
                          space: SearchSpace, resources: dict[str, float],
                          use_gpu: bool) -> MemoryProbe:
    """Check the probe's bound by measuring near it, up to the largest local batch of
    `space`'s candidates (`batch_limit.checked_max_local_batch`: the memory bound, and the
    model's own limit when its code refuses a batch, logged as a warning), each check one
    Ray task on a worker, then refit eq. 3 on every measured peak so the plan's memory
    predictions cover large batches too. Updates and returns `probe`."""
    task = _on_one_worker(_peak_on_worker, resources)
    workload, example = ray.put(probe.workload), ray.put(probe.facts.example)
    name = probe.workload.name
    measured = [(row["local_batch"], row["peak_mem_bytes"]) for row in probe.rows]
    bound, checks, limit = checked_max_local_batch(
        probe.params, lambda b: _get(task.remote(workload, b, use_gpu, example), name),
        device_bytes, local_batches=[c.local_batch for c in space.candidates()],
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
