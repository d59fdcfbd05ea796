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


def probe_memory(workload: str | Workload, options: dict[str, Any], *, min_local_batch: int,
                 use_gpu: bool) -> dict[str, Any]:
    """Measure peaks on one worker and fit the memory model.

    Returns {"params": MemoryParams, "rows": [{"local_batch", "peak_mem_bytes",
    "predicted_peak_mem_bytes"}], "device_memory_bytes": the GPU's size or None on CPU}.
    """
    local_batches = [min_local_batch * factor for factor in PROBE_BATCH_FACTORS]
    task = ray.remote(num_gpus=1 if use_gpu else 0, num_cpus=0 if use_gpu else 1)(_measure)
    measured = ray.get(task.remote(workload, options, local_batches, use_gpu))
    params = memory_model.fit(
        measured["local_batches"], measured["peaks"],
        static_bytes=measured["static"].total_bytes,
        batch_bytes_per_sample=measured["input_bytes_per_sample"])
    predicted = memory_model.predict_peak_bytes(params, measured["local_batches"])
    rows = [{"local_batch": b, "peak_mem_bytes": p, "predicted_peak_mem_bytes": float(q)}
            for b, p, q in zip(measured["local_batches"], measured["peaks"], predicted)]
    return {"params": params, "rows": rows, "device_memory_bytes": measured["device_memory_bytes"]}
