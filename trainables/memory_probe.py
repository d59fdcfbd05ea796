"""Memory probe (DESIGN step 1) as Ray tasks: peaks at a few local batches on one worker.

Runs on a worker (a whole GPU when the cluster has them), so the peaks and the
device size are the workers', not the driver's. The measuring is
`tula_ray.measure.probe_peaks` / `peak_or_none`, the fitting `tula_ray.memory`
(eq. 3): this module only ships them to a worker.
"""

from __future__ import annotations

from typing import Any

import ray

from tula_ray import measure
from tula_ray import memory as memory_model
from tula_ray.workloads import Workload, resolve_workload


def _measure_on_worker(workload: str | Workload, options: dict[str, Any],
                       local_batches: list[int], use_gpu: bool) -> dict[str, Any]:
    return measure.probe_peaks(resolve_workload(workload, options), local_batches,
                               device="cuda" if use_gpu else "cpu")


def _peak_on_worker(workload: str | Workload, options: dict[str, Any], local_batch: int,
                    use_gpu: bool) -> float | None:
    return measure.peak_or_none(resolve_workload(workload, options), local_batch,
                                device="cuda" if use_gpu else "cpu")


def _on_one_worker(function, use_gpu: bool):
    """`function` as a Ray task on one worker: a whole GPU when the cluster has them (the
    peaks and the device size are the GPU's), else one CPU."""
    return ray.remote(num_gpus=1 if use_gpu else 0, num_cpus=0 if use_gpu else 1)(function)


def probe_memory(workload: str | Workload, options: dict[str, Any], *, min_local_batch: int,
                 use_gpu: bool) -> dict[str, Any]:
    """Measure peaks on one worker and fit the memory model.

    Returns {"params": MemoryParams, "rows": [{"local_batch", "peak_mem_bytes",
    "predicted_peak_mem_bytes"}], "device_memory_bytes": the GPU's size or None on CPU,
    "device_in_use_bytes": what the device holds besides the model (CUDA context, ...),
    "static", "input_bytes_per_sample": what a refit needs}.
    """
    measured = ray.get(_on_one_worker(_measure_on_worker, use_gpu).remote(
        workload, options, memory_model.probe_batches(min_local_batch), use_gpu))
    probe = {key: measured[key] for key in ("device_memory_bytes", "device_in_use_bytes",
                                            "static", "input_bytes_per_sample")}
    points = list(zip(measured["local_batches"], measured["peaks"]))
    probe["params"] = memory_model.fit_probe(points, probe["static"],
                                             probe["input_bytes_per_sample"])
    probe["rows"] = memory_model.peak_rows(probe["params"], points)
    return probe


def check_max_local_batch(workload: str | Workload, options: dict[str, Any], probe: dict,
                          device_bytes: float, *, headroom: float, cap: int | None,
                          use_gpu: bool) -> dict[str, Any]:
    """Check the probe's bound by measuring near it (`memory.verified_max_local_batch`),
    each check one Ray task on a worker, then refit eq. 3 on every measured peak so the
    plan's memory predictions cover large batches too. Updates and returns `probe`."""
    task = _on_one_worker(_peak_on_worker, use_gpu)
    measured = [(row["local_batch"], row["peak_mem_bytes"]) for row in probe["rows"]]
    bound, checks = memory_model.verified_max_local_batch(
        probe["params"], lambda b: ray.get(task.remote(workload, options, b, use_gpu)),
        device_bytes, headroom=headroom, measured=measured, cap=cap)
    points = measured + [(b, peak) for b, peak in checks if peak is not None]
    if checks:
        probe["params"] = memory_model.fit_probe(points, probe["static"],
                                                 probe["input_bytes_per_sample"])
    probe["rows"] = [{**row, "bound_check": i >= len(measured)}
                     for i, row in enumerate(memory_model.peak_rows(probe["params"], points))]
    probe["bound_checks"] = [{"local_batch": b, "peak_mem_bytes": peak} for b, peak in checks]
    probe["max_local_batch"] = bound
    return probe
