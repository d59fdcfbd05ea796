"""The workload check and the memory probe (DESIGN step 1) as Ray tasks on one worker.

Each task takes one worker's resources (a whole GPU when the workers have GPUs), so the
check runs where the workers will (the driver may be a CPU head without the data, the
GPU or the packages), and the peaks and the device size are the workers', not the
driver's. The checking and measuring is `tula_ray.training.probe_task`
(`checked_and_measured`) and `tula_ray.training.measure` (`peak_or_none`), the fitting and the bound
`tula_ray.planning.bounds` (eq. 3, `MemoryProbe`): this module only ships them to a
worker. An error raised there (the workload's own code as a `UserCodeError` with the
worker's traceback, or a ValueError naming a bad field) is raised again in the driver
as it is, before any worker group starts; but a batch the workload's code refuses once a
smaller one ran is the model's own limit, a bound (`tula_ray.models.batch_limit`), and
the search goes on below it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import ray
from ray.exceptions import RaySystemError, RayTaskError

from tula_ray.cluster import task_options
from tula_ray.failures import UserCodeError
from tula_ray.models import memory as memory_model
from tula_ray.planning.bounds import MemoryProbe, checked_bound, fitted_probe
from tula_ray.space import SearchSpace
from tula_ray.training import measure, probe_task
from tula_ray.training.measure import Example
from tula_ray.workloads import Workload


def _device(use_gpu: bool) -> str:
    return "cuda" if use_gpu else "cpu"


def _check_and_measure(workload: str | Workload, options: dict[str, Any],
                       local_batches: list[int], use_gpu: bool,
                       strategy: Any = None, strategy_options: dict | None = None
                       ) -> dict[str, Any]:
    """The task's body: `probe_task.checked_and_measured` on this worker's device."""
    return probe_task.checked_and_measured(workload, options, local_batches,
                                           _device(use_gpu), strategy, strategy_options)


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


def probe_memory(workload: str | Workload, options: dict[str, Any], *, min_local_batch: int,
                 resources: dict[str, float], use_gpu: bool, training_strategy: Any = None,
                 training_options: dict | None = None) -> MemoryProbe:
    """Check the workload and measure peaks on one worker, then fit the memory model
    (`tula_ray.planning.bounds.fitted_probe`). training_strategy (a name or a portable
    strategy object), training_options: what `train` will use; the optimizer state it
    keeps beyond the workload's is measured there too (`probe_task.strategy_state_bytes`)."""
    started = time.perf_counter()
    measured = _get(_on_one_worker(_check_and_measure, resources).remote(
        workload, options, memory_model.probe_batches(min_local_batch), use_gpu,
        training_strategy, training_options), workload)
    return fitted_probe(measured, check_s=time.perf_counter() - started - measured["measure_s"])


def check_max_local_batch(probe: MemoryProbe, device_bytes: float, *, headroom: float,
                          space: SearchSpace, resources: dict[str, float],
                          use_gpu: bool) -> MemoryProbe:
    """`tula_ray.planning.bounds.checked_bound` with each measurement one Ray task on a
    worker: the bound found up to the largest local batch of `space`'s candidates (on a
    GPU by doubling and bisection, on a CPU eq. 3's bound checked), the model's own limit
    found, eq. 3 refitted. Updates and returns `probe`."""
    task = _on_one_worker(_peak_on_worker, resources)
    workload, example = ray.put(probe.workload), ray.put(probe.facts.example)
    name = probe.workload.name
    return checked_bound(probe, lambda b: _get(task.remote(workload, b, use_gpu, example), name),
                         device_bytes, headroom=headroom, space=space, doubling=use_gpu)
