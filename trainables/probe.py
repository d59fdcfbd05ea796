"""Memory probe (DESIGN step 1): peaks at a few local batch sizes on one worker -> eq. 3.

Runs as one Ray task on a worker (a GPU when the cluster has them), so the
peaks and the device size are the workers', not the driver's.
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from tula_ray import measure
from tula_ray import memory as memory_model
from tula_ray.workloads import Workload, resolve_workload

PROBE_BATCH_FACTORS = (1, 2, 4)  # three local batches: two identify eq. 3, the third checks it


def _measure(workload: str | Workload, options: dict[str, Any],
             local_batches: list[int], use_gpu: bool) -> dict[str, Any]:
    workload = resolve_workload(workload, options)
    device = torch.device("cuda" if use_gpu else "cpu")
    static = memory_model.static_memory(workload.model_fn(), workload.optimizer_fn)
    peaks = [measure.peak_memory_bytes(workload, b, device=device) for b in local_batches]
    total = torch.cuda.get_device_properties(device).total_memory if use_gpu else None
    return {"local_batches": local_batches, "peaks": peaks, "static": static,
            "input_bytes_per_sample": workload.input_bytes_per_sample,
            "device_memory_bytes": total}


def _on_one_worker(function, use_gpu: bool):
    """`function` as a Ray task on one worker: a whole GPU when the cluster has them (the
    peaks and the device size are the GPU's), else one CPU."""
    return ray.remote(num_gpus=1 if use_gpu else 0, num_cpus=0 if use_gpu else 1)(function)


def _fit_rows(probe: dict[str, Any], points: list[tuple[int, float]],
              refit: bool = True) -> list[dict[str, Any]]:
    """Fit eq. 3 on the (local batch, peak) points into probe["params"] (unless refit is
    False) and return one row per point with the fit's prediction beside the measurement."""
    batches, peaks = [b for b, _ in points], [peak for _, peak in points]
    if refit:
        probe["params"] = memory_model.fit(
            batches, peaks, static_bytes=probe["static"].total_bytes,
            batch_bytes_per_sample=probe["input_bytes_per_sample"])
    predicted = memory_model.predict_peak_bytes(probe["params"], batches)
    return [{"local_batch": b, "peak_mem_bytes": peak, "predicted_peak_mem_bytes": float(q)}
            for b, peak, q in zip(batches, peaks, predicted)]


def probe_memory(workload: str | Workload, options: dict[str, Any], *, min_local_batch: int,
                 use_gpu: bool) -> dict[str, Any]:
    """Measure peaks on one worker and fit the memory model.

    Returns {"params": MemoryParams, "rows": [{"local_batch", "peak_mem_bytes",
    "predicted_peak_mem_bytes"}], "device_memory_bytes": the GPU's size or None on CPU,
    "static", "input_bytes_per_sample": what a refit needs}.
    """
    local_batches = [min_local_batch * factor for factor in PROBE_BATCH_FACTORS]
    measured = ray.get(_on_one_worker(_measure, use_gpu).remote(
        workload, options, local_batches, use_gpu))
    probe = {key: measured[key] for key in ("device_memory_bytes", "static",
                                            "input_bytes_per_sample")}
    probe["rows"] = _fit_rows(probe, list(zip(measured["local_batches"], measured["peaks"])))
    return probe


def _peak_or_none(workload: str | Workload, options: dict[str, Any], local_batch: int,
                  use_gpu: bool) -> float | None:
    """One probe step's peak at a large local batch; None if the GPU runs out of memory."""
    workload = resolve_workload(workload, options)
    try:
        return float(measure.peak_memory_bytes(workload, local_batch,
                                               device="cuda" if use_gpu else "cpu"))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def check_max_local_batch(workload: str | Workload, options: dict[str, Any], probe: dict,
                          device_bytes: float, *, headroom: float, cap: int | None,
                          use_gpu: bool) -> dict[str, Any]:
    """Check the probe's bound by measuring near it (`memory.verified_max_local_batch`),
    each check one Ray task on a worker, then refit eq. 3 on every measured peak so the
    plan's memory predictions cover large batches too. Updates and returns `probe`."""
    task = _on_one_worker(_peak_or_none, use_gpu)
    measured = [(row["local_batch"], row["peak_mem_bytes"]) for row in probe["rows"]]
    bound, checks = memory_model.verified_max_local_batch(
        probe["params"], lambda b: ray.get(task.remote(workload, options, b, use_gpu)),
        device_bytes, headroom=headroom, measured=measured, cap=cap)
    points = measured + [(b, peak) for b, peak in checks if peak is not None]
    probe["rows"] = [{**row, "bound_check": i >= len(measured)}
                     for i, row in enumerate(_fit_rows(probe, points, refit=bool(checks)))]
    probe["bound_checks"] = [{"local_batch": b, "peak_mem_bytes": peak} for b, peak in checks]
    probe["max_local_batch"] = bound
    return probe
