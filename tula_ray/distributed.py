"""torch.distributed, as every module of tula-ray uses it: the world size and reductions
over the ranks, with one rule for where a collective's tensor lives.

No Ray here (core): the same code runs in a Ray Train worker group, under
`torch.distributed.run`, or in one process (world size 1, every reduction the identity).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def is_distributed() -> bool:
    """torch.distributed is initialized (any world size)."""
    return dist.is_available() and dist.is_initialized()


def world_size(process_group: Any = None) -> int:
    """Ranks in `process_group` (the default group when None); 1 without torch.distributed."""
    return dist.get_world_size(process_group) if is_distributed() else 1


def reduce_device(device: torch.device | str, process_group: Any = None) -> torch.device:
    """Where a collective's tensor must live: NCCL takes CUDA tensors (the caller's device,
    or the current CUDA device), gloo CPU ones."""
    device = torch.device(device)
    if dist.get_backend(process_group) == "nccl":
        return device if device.type == "cuda" else torch.device(
            "cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduced(values: list[float], device: torch.device | str, op: str,
             process_group: Any = None) -> list[float]:
    """`values` all-reduced with `dist.ReduceOp.<op>` (one collective for the list)."""
    if world_size(process_group) == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64,
                          device=reduce_device(device, process_group))
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), group=process_group)
    return tensor.tolist()


def sum_over_ranks(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """Each value summed over the ranks (one all-reduce for the list)."""
    return _reduced(values, device, "SUM")


def mean_over_ranks(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """Each value averaged over the ranks."""
    world = world_size()
    return [value / world for value in sum_over_ranks(values, device)]


def max_over_ranks(values: list[float], device: torch.device | str = "cpu",
                   process_group: Any = None) -> list[float]:
    """Each value's maximum over the ranks (of `process_group`; the default group when
    None): a step is as slow as its slowest worker."""
    return _reduced(values, device, "MAX", process_group)


def gathered_objects(value: Any, process_group: Any = None) -> list[Any]:
    """Every rank's `value` (picklable), in rank order; [value] without torch.distributed."""
    if world_size(process_group) == 1:
        return [value]
    values: list[Any] = [None] * world_size(process_group)
    dist.all_gather_object(values, value, group=process_group)
    return values


def broadcast_from_rank0(value: Any, process_group: Any = None) -> Any:
    """Rank 0's `value` (picklable) on every rank: one rank decides, all follow (the
    adaptive batch's choice); `value` itself without torch.distributed."""
    if world_size(process_group) == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=process_group)
    return box[0]


def side_group(timeout_s: float) -> Any:
    """A gloo group over every rank of the default group, with its own connections and
    `timeout_s`: what it carries never queues behind, or pairs with, a collective of the
    default group (NCCL's, DDP's) that a rank may be left waiting in. None without
    torch.distributed. Every rank must call it, at the same point."""
    if not is_distributed():
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def abort_collectives() -> None:
    """Abort this rank's collectives of the default group that are still in flight
    (`ProcessGroup.abort`: NCCL's ncclCommAbort ends its kernels, freeing the device's
    queue behind them; gloo cannot and leaves them to their timeout). The group is
    unusable after it: for a worker group that ends. Nothing without torch.distributed."""
    if is_distributed():
        dist.group.WORLD.abort()


def average_tensors_over_ranks(tensors: list[torch.Tensor], process_group: Any = None) -> None:
    """In place: each tensor's mean over the ranks of `process_group` (one all-reduce each).

    SUM then divide, since ReduceOp.AVG exists for NCCL only. Every rank receives the
    same bits, which is what keeps data-parallel replicas identical.
    """
    world = world_size(process_group)
    if world == 1:
        return
    for tensor in tensors:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=process_group)
        tensor.div_(world)


def replicas_from_rank0(model: nn.Module, process_group: Any = None) -> None:
    """In place: every rank's parameters and buffers set to rank 0's (one broadcast per
    tensor of its `state_dict`, whose tensors share the module's storage). Steps a rank
    took on its own gradient (DDP's `no_sync`) leave the replicas apart; this joins them
    again. Nothing on one rank."""
    if world_size(process_group) == 1:
        return
    for tensor in unwrapped(model).state_dict().values():
        dist.broadcast(tensor, src=0, group=process_group)


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper (the model itself otherwise): what
    a checkpoint saves and a plain, collective-free forward runs."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


NCCL_LIBRARY = "libnccl.so"  # not libnccl-net.so, a network plugin (EFA's aws-ofi-nccl)


def loaded_libraries(maps_text: str, name: str = NCCL_LIBRARY) -> list[str]:
    """The files whose name starts with `name` that a process mapped, from the text of its
    /proc/<pid>/maps (one mapping a line, the path last), each once, in order."""
    paths: list[str] = []
    for line in maps_text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[-1]).name.startswith(name) \
                and fields[-1] not in paths:
            paths.append(fields[-1])
    return paths
