"""The one data path of training and profiling (issue 24): one rank's batches of a dataset,
epoch by epoch, already on the training device. The profiling loop times these batches
with each step, so the plan counts what an epoch of `tula_ray.train` waits for.

Two ways to a batch, chosen by the dataset:
  - in-memory tensors (a `TensorDataset`, or `Subset`s of one, as the built-ins and the
    validation split are): each batch is gathered by index in one operation per tensor,
    from a copy on the GPU when the data fit (`fits_on_device`), else from page-locked
    memory and copied `non_blocking`; on CPU straight from the tensors. A DataLoader
    would call `__getitem__` and collate per sample: 7.5-17 µs a sample here, more
    than a small model's whole GPU step.
  - any other `Dataset`: torch's DataLoader, with worker processes and pinned memory
    (the workload's `loader_workers` and `pin_memory`; defaults that suit the device).
Either way the order is `DistributedSampler`'s, a function of (seed, epoch) only, so a
resumed run sees the batches an unbroken one would, whichever path served them. No Ray
here (core module).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

# The data stay on the GPU when they take at most this share of its free memory: the
# rest is the model's (the profile's peak, `max_memory_allocated`, counts them).
DEVICE_DATA_SHARE = 0.25
LOADER_WORKERS_MAX = 4  # DataLoader processes per rank by default on a GPU

Batch = tuple[torch.Tensor, torch.Tensor]


class TensorSource:
    """In-memory tensors that batches are gathered from, where they were placed once.

    location: "device" (a copy on the GPU), "pinned" (page-locked host memory, copied
    to the GPU without blocking) or "host" (CPU training: used in place)."""

    def __init__(self, tensors: Sequence[torch.Tensor], index: torch.Tensor | None,
                 device: torch.device, location: str) -> None:
        self.tensors, self.index = tuple(tensors), index
        self.device, self.location = device, location

    def __len__(self) -> int:
        return len(self.index) if self.index is not None else len(self.tensors[0])

    @property
    def device_bytes(self) -> int:
        """Bytes this source keeps on the GPU: its tensors' when placed there, else 0 (what
        `device_resident_bytes` counted in the probe's memory in use)."""
        if self.location != "device":
            return 0
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def gather(self, positions: torch.Tensor) -> Batch:
        """The samples at `positions` (indices into this source), on the device."""
        if self.index is not None:
            positions = self.index[positions]
        if self.location == "pinned":
            inputs, targets = (self._pinned(tensor, positions).to(self.device, non_blocking=True)
                               for tensor in self.tensors)
            return inputs, targets
        if self.location == "device":
            positions = positions.to(self.device, non_blocking=True)
        inputs, targets = (tensor.index_select(0, positions) for tensor in self.tensors)
        return inputs, targets

    @staticmethod
    def _pinned(tensor: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rows at `positions`, gathered straight into page-locked memory (torch's
        caching host allocator reuses it once the copy that reads it has finished)."""
        buffer = torch.empty((len(positions), *tensor.shape[1:]), dtype=tensor.dtype,
                             pin_memory=True)
        return torch.index_select(tensor, 0, positions, out=buffer)


def in_memory_tensors(dataset: Dataset
                      ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None] | None:
    """(tensors, index into them or None) when `dataset` is a TensorDataset of (inputs,
    targets), or Subsets of one; None for any other dataset."""
    index: torch.Tensor | None = None
    while isinstance(dataset, Subset):
        positions = torch.as_tensor(list(dataset.indices), dtype=torch.long)
        index = positions if index is None else positions[index]
        dataset = dataset.dataset
    if not isinstance(dataset, TensorDataset) or len(dataset.tensors) != 2:
        return None
    return dataset.tensors, index


def fits_on_device(tensors: Sequence[torch.Tensor], device: torch.device) -> bool:
    """Whether a copy of `tensors` takes at most `DEVICE_DATA_SHARE` of the GPU's free memory."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return sum(t.numel() * t.element_size() for t in tensors) <= DEVICE_DATA_SHARE * free


def device_resident_bytes(dataset: Dataset, device: torch.device | str,
                          on_device: bool | None = None) -> int:
    """Bytes of `dataset` that the data path keeps on `device` (`tensor_source`): its
    tensors when they go to the GPU, else 0. The memory model counts them beside the
    model (`tula_ray.training.measure.probe_peaks`)."""
    device = torch.device(device)
    found = in_memory_tensors(dataset)
    if found is None or device.type != "cuda" or on_device is False:
        return 0
    tensors = found[0]
    if on_device is None and not fits_on_device(tensors, device):
        return 0
    return sum(t.numel() * t.element_size() for t in tensors)


def tensor_source(dataset: Dataset, device: torch.device | str, *,
                  on_device: bool | None = None) -> TensorSource | None:
    """The dataset's tensors placed for `device` (see `TensorSource`), or None when the
    dataset is not in-memory tensors. on_device: keep a copy on the GPU (None: when it
    fits, `fits_on_device`); ignored on CPU."""
    found = in_memory_tensors(dataset)
    if found is None:
        return None
    tensors, index = found
    device = torch.device(device)
    if device.type != "cuda":
        return TensorSource(tensors, index, device, "host")
    if on_device is None:
        on_device = fits_on_device(tensors, device)
    if on_device:
        index = None if index is None else index.to(device)
        return TensorSource([t.to(device) for t in tensors], index, device, "device")
    return TensorSource(tensors, index, device, "pinned")


def loader_workers(device: torch.device, requested: int | None) -> int:
    """DataLoader processes per rank: `requested`, else none on CPU (they would take the
    cores the model trains on), else up to `LOADER_WORKERS_MAX`, one core kept for the
    training process (Ray sets the worker's threads to its CPU share)."""
    if requested is not None:
        return requested
    if device.type != "cuda":
        return 0
    return max(0, min(LOADER_WORKERS_MAX, torch.get_num_threads() - 1))


class Batches:
    """One rank's batches of `dataset` in `order`, on `device`: iterate for an epoch;
    `set_epoch(epoch)` before each (the sampler's reshuffle). `path` says how they are
    made ("gather-device", "gather-pinned", "gather-host" or "loader")."""

    def __init__(self, dataset: Dataset, batch: int, device: torch.device | str, *,
                 sampler: DistributedSampler | None = None, drop_last: bool = True,
                 source: TensorSource | None = None, seed: int = 0,
                 workers: int | None = None, pin_memory: bool | None = None,
                 on_device: bool | None = None) -> None:
        self.dataset, self.batch, self.device = dataset, batch, torch.device(device)
        self.sampler, self.drop_last = sampler, drop_last
        self.source = source if source is not None else tensor_source(
            dataset, self.device, on_device=on_device)
        self.loader: DataLoader | None = None
        if self.source is None:
            workers = loader_workers(self.device, workers)
            pin = self.device.type == "cuda" if pin_memory is None else pin_memory
            # The generator keeps the loader from drawing its base seed from the global RNG.
            self.loader = DataLoader(
                dataset, batch_size=batch, sampler=sampler, shuffle=False, drop_last=drop_last,
                generator=torch.Generator().manual_seed(seed), num_workers=workers,
                pin_memory=pin, persistent_workers=workers > 0)
            self.path = "loader"
        else:
            self.path = f"gather-{self.source.location}"

    @property
    def pin_memory(self) -> bool:
        return self.path == "gather-pinned" or bool(self.loader and self.loader.pin_memory)

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def _order(self) -> torch.Tensor:
        if self.sampler is None:
            return torch.arange(len(self.dataset))  # type: ignore[arg-type]
        return torch.as_tensor(list(self.sampler), dtype=torch.long)

    def __len__(self) -> int:
        indexed = self.sampler if self.sampler is not None else self.dataset
        size = len(indexed)  # type: ignore[arg-type]
        return size // self.batch if self.drop_last else -(-size // self.batch)

    def __iter__(self) -> Iterator[Batch]:
        if self.loader is not None:
            for inputs, targets in self.loader:
                yield (inputs.to(self.device, non_blocking=True),
                       targets.to(self.device, non_blocking=True))
            return
        order, start = self._order(), 0
        # self.batch is read at every step: a `resize` serves the new size from the next.
        while start < len(order) and (not self.drop_last or start + self.batch <= len(order)):
            size = self.batch  # the batch served; a resize while it trains sizes the next
            yield self.source.gather(order[start:start + size])  # type: ignore[union-attr]
            start += size

    def resize(self, batch: int) -> None:
        """Serve batches of `batch` samples from the next one on (the adaptive global
        batch, `tula_ray.training.batch_controller`), mid-epoch included: the epoch goes on
        through the same order. In-memory tensors only: a DataLoader's worker processes
        have batches of the old size in flight."""
        if self.loader is not None:
            raise ValueError(f"an adaptive batch needs the training set as in-memory tensors "
                             f"(a TensorDataset, or Subsets of one); this one "
                             f"({type(self.dataset).__name__}) is served by a DataLoader, "
                             f"whose batch size is fixed: train it at a fixed batch")
        self.batch = int(batch)


def training_batches(dataset: Dataset, batch: int, device: torch.device | str, *, seed: int,
                     num_replicas: int = 1, rank: int = 0, **options) -> Batches:
    """Replica `rank`'s training batches: shuffled by a DistributedSampler seeded with
    `seed` (the order a function of (seed, epoch)), the last incomplete batch dropped.
    options: `Batches`' (source, workers, pin_memory, on_device)."""
    sampler = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    return Batches(dataset, batch, device, sampler=sampler, drop_last=True, seed=seed, **options)


def evaluation_batches(dataset: Dataset, batch: int, device: torch.device | str, *,
                       num_replicas: int = 1, rank: int = 0, **options) -> Batches:
    """Replica `rank`'s contiguous-stride share of `dataset` (every sample on exactly one
    rank), unshuffled, the last batch kept: all-reduced sums cover the whole set once."""
    share = Subset(dataset, range(rank, len(dataset), num_replicas))  # type: ignore[arg-type]
    return Batches(share, batch, device, drop_last=False, **options)
