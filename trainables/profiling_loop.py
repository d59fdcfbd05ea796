"""The Ray Train per-worker loop that profiles one (N, B) candidate (DESIGN "Data flow" step 3).

Phases, all at local batch b = B / N on the workload's real data:
  1. memory (CPU only): one short MemTracker pass on a separate model copy;
     a peak over `device_memory_bytes` ends the candidate as "oom";
  2. warm-up: `warmup_steps` synced steps, not timed (allocator, thread pools);
  3. compute: `measure_steps` steps under DDP's `no_sync()`: no all-reduce;
  4. synced: `measure_steps` ordinary DDP steps.
Compute and synced steps are separate phases, not interleaved: with BatchNorm,
DDP broadcasts buffers in the forward after a synced step (NOTES-ENV).
Only the train step is timed; fetching the next batch is outside the timer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any, Iterator

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from tula_ray.measure import StepTimer, peak_memory_bytes, train_step
from tula_ray.profile_table import MAX_ERROR_CHARS, STATUS_OK, STATUS_OOM, empty_row
from tula_ray.workloads import resolve_workload

logger = logging.getLogger(__name__)

WARMUP_STEPS_DEFAULT = 3
MEASURE_STEPS_DEFAULT = 8
SEED_DEFAULT = 0


def _cycle(loader: DataLoader) -> Iterator:
    """Batches forever; a new shuffle (sampler epoch) on each pass over the data."""
    for epoch in itertools.count():
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader


def _timed_steps(count: int, batches: Iterator, model, optimizer, loss_fn,
                 device: torch.device) -> list[float]:
    seconds = []
    for _ in range(count):
        inputs, targets = next(batches)
        with StepTimer(device) as timer:
            train_step(model, optimizer, loss_fn, inputs, targets)
        seconds.append(timer.seconds)
    return seconds


def _max_over_workers(values: list[float], device: torch.device) -> list[float]:
    """Element-wise max over all workers: the slowest worker sets the synchronous step."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    # NCCL reduces CUDA tensors only; gloo takes CPU tensors.
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.float64, device=where)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _spread(seconds: list[float]) -> float:
    """Interquartile range over median: the run's own timing noise (NOTES-ENV: ~15 %)."""
    if len(seconds) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(seconds, n=4)
    return (q3 - q1) / statistics.median(seconds)


def _report(row: dict[str, Any], with_checkpoint: bool) -> None:
    """Every worker reports (it is a barrier); rank 0's metrics are the ones kept.

    A tiny checkpoint is optional: Train V2 fills `Result.metrics` only when a
    checkpoint was reported, while the Tune route (TuneReportCallback) needs none.
    """
    rank = ray.train.get_context().get_world_rank()
    if not with_checkpoint or rank != 0:
        ray.train.report(row)
        return
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "profile.json").write_text(json.dumps(row))
        ray.train.report(row, checkpoint=ray.train.Checkpoint.from_directory(directory))


def profile_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train loop: profile `config["global_batch"]` on this worker group, report one row.

    config: workload (name or Workload), workload_options, global_batch,
    warmup_steps, measure_steps, device_memory_bytes (optional: a CPU peak above
    it is "oom"), measure_memory (default True), seed, report_checkpoint.
    """
    context = ray.train.get_context()
    world_size = context.get_world_size()
    global_batch = int(config["global_batch"])
    row = empty_row(world_size, global_batch)
    try:
        row.update(_profile(config, world_size, global_batch))
    except torch.OutOfMemoryError as exc:
        # Every worker runs the same local batch, so all of them fail alike.
        logger.warning("out of memory at B=%d N=%d: %s", global_batch, world_size, exc)
        row.update(status=STATUS_OOM, error=f"OutOfMemoryError: {exc}"[-MAX_ERROR_CHARS:])
    _report(row, bool(config.get("report_checkpoint", False)))


def _profile(config: dict[str, Any], world_size: int, global_batch: int) -> dict[str, Any]:
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} is not divisible by num_workers="
                         f"{world_size}; B must be a multiple of N")
    local_batch = global_batch // world_size
    warmup = int(config.get("warmup_steps", WARMUP_STEPS_DEFAULT))
    measure = int(config.get("measure_steps", MEASURE_STEPS_DEFAULT))
    if warmup < 0 or measure < 1:
        raise ValueError(f"warmup_steps={warmup}, measure_steps={measure}; "
                         "need warmup_steps >= 0 and measure_steps >= 1")
    workload = resolve_workload(config["workload"], config.get("workload_options"))
    device = ray.train.torch.get_device()
    torch.manual_seed(int(config.get("seed", SEED_DEFAULT)))
    # Diagnostics beside the profile fields: per-worker compute speed depends on them (NOTES-ENV).
    result: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "device": device.type,
                              "cpus_per_worker": config.get("cpus_per_worker", math.nan)}

    # 1. Memory. CUDA: the allocator's counter over the real run (below).
    limit = config.get("device_memory_bytes")
    if device.type != "cuda" and config.get("measure_memory", True):
        (peak,) = _max_over_workers([float(peak_memory_bytes(workload, local_batch,
                                                             device=device))], device)
        result.update(peak_mem_bytes=peak, memory_source="memtracker")
        if limit is not None and peak > float(limit):
            return {**result, "status": STATUS_OOM,
                    "error": f"peak {peak:.4g} bytes > device_memory_bytes {float(limit):.4g}"}

    dataset = workload.train_dataset_fn()
    if len(dataset) < global_batch:  # type: ignore[arg-type]
        raise ValueError(f"global_batch={global_batch} is larger than the dataset of "
                         f"{workload.name} ({len(dataset)} samples)")  # type: ignore[arg-type]
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(dataset, batch_size=local_batch, shuffle=True, drop_last=True))
    model = ray.train.torch.prepare_model(workload.model_fn())
    model.train()
    optimizer, loss_fn = workload.optimizer_fn(model.parameters()), workload.loss_fn()
    batches = _cycle(loader)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    # 2-4. Warm-up, compute-only, synced. One worker: no DDP wrapper, no
    # collective, so the synced phase would repeat the compute phase: sync = 0.
    _timed_steps(warmup, batches, model, optimizer, loss_fn, device)
    distributed = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    with model.no_sync() if distributed else contextlib.nullcontext():
        compute = _timed_steps(measure, batches, model, optimizer, loss_fn, device)
    step = _timed_steps(measure, batches, model, optimizer, loss_fn, device) if distributed \
        else compute

    medians = [statistics.median(compute), statistics.median(step), _spread(step)]
    if device.type == "cuda":
        medians.append(float(torch.cuda.max_memory_allocated(device)))
    reduced = _max_over_workers(medians, device)
    compute_s, step_s, spread = reduced[:3]
    # Timing noise (~15 % here) can make the compute-only median exceed the
    # synced one when the collective is cheap; sync cannot be negative, so the
    # whole step is then compute and the row stays consistent: step = compute + sync.
    compute_s = min(compute_s, step_s)
    result.update(
        compute_time_s=compute_s, step_time_s=step_s, sync_time_s=step_s - compute_s,
        samples_per_s=global_batch / step_s, step_time_spread=spread,
        warmup_steps=warmup, measure_steps=measure, status=STATUS_OK, error="")
    if device.type == "cuda":
        result.update(peak_mem_bytes=reduced[3], memory_source="cuda")
        # The user may declare a device smaller than this GPU.
        if limit is not None and reduced[3] > float(limit):
            result.update(status=STATUS_OOM, error=f"peak {reduced[3]:.4g} bytes > "
                                                   f"device_memory_bytes {float(limit):.4g}")
    return result

