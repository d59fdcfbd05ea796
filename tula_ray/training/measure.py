"""Measuring one worker's training steps: peak memory (paper eq. 3's M) and step time.

Peak memory: on CUDA the caching allocator's own counter of the memory it reserved
(`torch.cuda.max_memory_reserved`, reset before each measurement with the cache
emptied: what the device must hold, fragmentation included; it was 1.55x the tensors'
`max_memory_allocated` for the CNN at b = 4096 on an H100); on CPU, where the allocator
keeps no such counter, torch's MemTracker (a TorchDispatchMode that follows every tensor
storage). MemTracker counts tensors only (not allocator slack or, under DDP,
the gradient buckets), and slows the steps it watches, so it watches untimed
steps only: the memory probe's short passes, and one warm-up step of each
profiled batch.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable, ContextManager

import torch
from torch import nn

from tula_ray.arguments import check_int
from tula_ray.failures import UserCodeError, workload_code
from tula_ray.models import bound_search
from tula_ray.precision import autocast_for
from tula_ray.training.batches import device_resident_bytes
from tula_ray.workloads import Workload

MEMORY_STEPS_DEFAULT = 2  # step 1 creates the optimizer state; step 2 runs at steady state


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable,
               inputs: torch.Tensor, targets: torch.Tensor, *,
               autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> torch.Tensor:
    """One forward (under `autocast`) + backward + optimizer step; returns the detached loss."""
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def synchronize(device: torch.device | str) -> None:
    """Wait for queued CUDA kernels so a wall-clock reading covers them (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Context manager timing a block in seconds, synchronising CUDA at both ends.

    >>> with StepTimer(device) as timer: ...
    >>> timer.seconds
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.seconds = float("nan")
        self._start = 0.0

    def __enter__(self) -> "StepTimer":
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._start


def synthetic_batch(sample_shape: tuple[int, ...], num_classes: int, batch: int,
                    device: torch.device | str = "cpu",
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and labels of a real batch's shape: memory depends on shapes, not values."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn((batch, *sample_shape), generator=generator)
    targets = torch.randint(0, num_classes, (batch,), generator=generator)
    return inputs.to(device), targets.to(device)


Example = tuple[torch.Tensor, torch.Tensor]  # a few real samples (inputs, targets), batched


def tiled_batch(example: Example, batch: int,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of `batch` copies of `example`'s first sample: the shapes and dtypes of a
    real batch (memory depends on them, not on the values), on `device`."""
    return tuple(part[:1].expand(batch, *part.shape[1:]).to(device).contiguous()
                 for part in example)  # type: ignore[return-value]


def peak_memory_bytes(
    target: Workload | tuple[nn.Module, torch.optim.Optimizer, Callable],
    local_batch: int,
    *,
    steps: int = MEMORY_STEPS_DEFAULT,
    device: torch.device | str | None = None,
    example: Example | None = None,
    sample_shape: tuple[int, ...] | None = None,
    num_classes: int | None = None,
) -> int:
    """Peak bytes one worker holds while training `steps` steps at batch `local_batch`.

    target: a Workload (a fresh model and optimizer are built; its `precision` is the
    step's), or (model, optimizer, loss_fn) already on `device` (they are trained for
    `steps` steps in fp32).
    example: the workload's first training samples (`workload_check.WorkloadFacts`),
    tiled into the batches; without it, random float inputs of sample_shape and labels
    below num_classes (the workload's, or given). device: default CUDA when available.
    On CUDA the peak is `torch.cuda.max_memory_reserved` over the steps, the cache
    emptied and the peak stats reset before them (`reset_reserved_peak`), so another
    measurement's blocks are not in it. Raises torch.OutOfMemoryError when a CUDA device
    runs out.
    """
    check_int("local_batch", local_batch, minimum=1)
    if steps < 1:
        raise ValueError(f"steps={steps!r}; at least one step is needed to see a peak")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    autocast: Callable[[], ContextManager] = contextlib.nullcontext
    if isinstance(target, Workload):
        autocast = autocast_for(target.precision, device)
        model = target.model_fn().to(device)
        optimizer, loss_fn = target.optimizer_fn(model.parameters()), target.loss_fn()
        sample_shape = sample_shape or target.sample_shape
        num_classes = num_classes or target.num_classes
    else:
        model, optimizer, loss_fn = target
    if example is None:
        if sample_shape is None or num_classes is None:
            raise ValueError("give example, or sample_shape and num_classes (a Workload's "
                             "own, or given)")
        example = synthetic_batch(sample_shape, num_classes, 2)
    model.train()

    def step() -> None:
        # The batch is made inside the step (and the CPU tracker): a worker holds it too.
        train_step(model, optimizer, loss_fn, *tiled_batch(example, local_batch, device),
                   autocast=autocast)

    return peak_over([step] * steps, device, model, optimizer)


def peak_over(steps: list[Callable[[], object]], device: torch.device,
              *external: nn.Module | torch.optim.Optimizer | torch.Tensor) -> int:
    """Peak bytes while `steps` run on `device`, what is held already counted in it: on
    CUDA `max_memory_reserved` from a reset (`reset_reserved_peak`), on CPU torch's
    MemTracker with `external` (the model, optimizer and tensors built before) registered."""
    if device.type == "cuda":
        reset_reserved_peak(device)
        for step in steps:
            step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_reserved(device))
    return memtracker_peak_bytes(steps, *external)


def reset_reserved_peak(device: torch.device) -> None:
    """Before a CUDA measurement of `max_memory_reserved`: what an earlier measurement left
    collected and its cached blocks released (`empty_cache`), then the peak stats reset, so
    the peak that follows is this measurement's own reservation."""
    torch.cuda.synchronize(device)
    gc.collect()  # an earlier measurement's model and optimizer, held in reference cycles
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def memtracker_peak_bytes(steps: list[Callable[[], object]], *external: nn.Module |
                          torch.optim.Optimizer | torch.Tensor) -> int:
    """Peak tensor bytes (CPU: torch's MemTracker) over `steps`, each one training step;
    `external`: the model, optimizer and tensors (a batch) they use, built before."""
    # Imported here: torch.distributed._tools is private API, needed on CPU only.
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*external)  # built outside the tracker: register them
    with tracker:
        for step in steps:
            step()
            # Per-module snapshots refuse a second forward; the global peak is kept.
            tracker.reset_mod_stats()
    peak = tracker.get_tracker_snapshot("peak")
    return int(sum(snapshot["Total"] for snapshot in peak.values()))


def probe_peaks(workload: Workload, local_batches: list[int],
                device: torch.device | str = "cpu", example: Example | None = None) -> dict:
    """The memory probe's measurements (DESIGN step 1), on this process's `device`, with
    batches of `example`'s samples (see `peak_memory_bytes`).

    Returns {"local_batches": those measured, "peaks": peak bytes at each, "refused":
    {b: message} where the workload's own code failed at b after a smaller batch ran (the
    probe stops there; at the smallest batch its UserCodeError is raised), "static": eq.
    3's static terms (`memory.static_memory`), "input_bytes_per_sample",
    "device_memory_bytes": the GPU's size, None on CPU, "device_in_use_bytes":
    `device_in_use_bytes` plus, on a GPU, the datasets the data path will keep there
    (`batches.device_resident_bytes`)}.
    """
    from tula_ray.models import memory  # eq. 3's static terms

    device = torch.device(device)
    static = memory.static_memory(workload.model_fn(), workload.optimizer_fn)
    peaks: list[float] = []
    refused: dict[int, str] = {}
    for b in local_batches:
        try:
            peaks.append(_probe_step_peak(workload, b, device, example))
        except UserCodeError as error:
            if not peaks:
                raise  # fails at the smallest batch: nothing below to search in
            refused[b] = error.message  # the model's own limit: a bound, as memory is
            break
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" \
        else None
    in_use = device_in_use_bytes(device)
    if device.type == "cuda":  # the datasets the data path keeps on the GPU, beside the model
        datasets = [workload.train_dataset_fn()] + (
            [workload.test_dataset_fn()] if workload.test_dataset_fn is not None else [])
        in_use += sum(device_resident_bytes(data, device, workload.data_on_device)
                      for data in datasets)
    return {"local_batches": list(local_batches[:len(peaks)]), "peaks": peaks,
            "refused": refused, "static": static,
            "input_bytes_per_sample": workload.input_bytes_per_sample,
            "device_memory_bytes": total, "device_in_use_bytes": in_use}


def _probe_step_peak(workload: Workload, local_batch: int, device: torch.device | str,
                     example: Example | None) -> float:
    """`peak_memory_bytes` of the workload at `local_batch`; its own code failing raises a
    UserCodeError naming the probe and the batch (out of memory leaves as it is)."""
    with workload_code(workload.name, f"memory probe at local batch {local_batch}"):
        return float(peak_memory_bytes(workload, local_batch, device=device, example=example))


def device_in_use_bytes(device: torch.device | str) -> float:
    """Memory of `device` that no model of ours holds: on CUDA total minus free, once the
    caching allocator has returned its unused blocks (the CUDA context, other processes'
    memory); 0 on CPU, where the declared share of RAM is the device.

    `max_memory_allocated` counts tensors only, so a bound from it and the device's total
    would spend this memory twice (`memory.device_budget_bytes` takes it off).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return 0.0
    gc.collect()  # the probe's models and optimizers, before the allocator can release them
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return float(total - free)


def peak_or_none(workload: Workload, local_batch: int, device: torch.device | str = "cpu",
                 example: Example | None = None) -> float | None:
    """One probe step's peak at `local_batch`; None if the device runs out of memory
    (`bound_search.peak_or_none`, the one place a try's out of memory is caught). The
    workload's own code failing raises a UserCodeError naming the probe and the batch."""
    release = torch.cuda.empty_cache if torch.device(device).type == "cuda" else None
    return bound_search.peak_or_none(
        lambda b: _probe_step_peak(workload, b, device, example), local_batch,
        after_out_of_memory=release)


def reset_peak_memory(device: torch.device | str) -> None:
    """Start the device's peak counter afresh (CUDA's `max_memory_allocated`), so that what
    ran before (another phase's second model) is not in the next reading. A no-op on CPU:
    MemTracker keeps no peak beyond the steps it watches."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# DDP's bucket size: torch's DistributedDataParallel(bucket_cap_mb=None) fills buckets of
# 25 MiB; the default `train` and the profiling sweep use.
DDP_BUCKET_CAP_BYTES = 25 * 2**20


def ddp_bucket_bytes(model: nn.Module) -> int:
    """The bytes of DDP's full gradient bucket for `model`: its gradients' bytes
    (`memory.gradient_bytes`) up to `DDP_BUCKET_CAP_BYTES`."""
    from tula_ray.models.memory import gradient_bytes

    return min(DDP_BUCKET_CAP_BYTES, gradient_bytes(model))


def collective_buffer_bytes(device: torch.device | str,
                            all_reduce: Callable[[torch.Tensor], object], *, bucket_bytes: int,
                            mem_get_info: Callable[..., tuple[int, int]] | None = None,
                            memory_reserved: Callable[..., int] | None = None,
                            zeros: Callable[..., torch.Tensor] | None = None) -> float | None:
    """Bytes the collective library (NCCL) takes on `device` when the worker group's first
    collective creates its communicator: `all_reduce` (torch.distributed.all_reduce on the
    default group) of a float32 tensor of `bucket_bytes` (`ddp_bucket_bytes`: DDP's
    bucket, a real size, not one element: NCCL >= 2.22 connects its channels lazily, at
    the first collective that needs them, so a 1-element all-reduce would see a fraction
    of its buffers). Measured as the fall of free device memory (`torch.cuda.mem_get_info`:
    NCCL's memory is outside torch's caching allocator) less what the allocator reserved
    meanwhile: the bucket tensor's own bytes (none when a cached block served it). None
    on CPU (gloo: nothing on a device to measure), or when free memory did not fall
    beyond the tensor (a communicator made before: nothing to measure here).
    mem_get_info, memory_reserved, zeros: torch.cuda's and torch's, unless given (tests).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    check_int("bucket_bytes", bucket_bytes, minimum=1)
    mem_get_info = mem_get_info or torch.cuda.mem_get_info
    memory_reserved = memory_reserved or torch.cuda.memory_reserved
    zeros = zeros or torch.zeros
    synchronize(device)
    free_before, reserved_before = mem_get_info(device)[0], memory_reserved(device)
    bucket = zeros(max(1, bucket_bytes // 4), dtype=torch.float32, device=device)
    all_reduce(bucket)
    synchronize(device)
    free_after, reserved_after = mem_get_info(device)[0], memory_reserved(device)
    del bucket  # back to the allocator's cache, for the model that follows
    taken = (free_before - free_after) - (reserved_after - reserved_before)
    return float(taken) if taken > 0 else None
