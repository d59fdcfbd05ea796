"""The one data path of training and profiling (issue 24), on CPU, with a user's own data:
in-memory tensors gathered by index give exactly the batches torch's DataLoader would, in
the same order, and any other Dataset goes through a DataLoader with the same order."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from tula_ray.training.batches import (Batches, evaluation_batches, in_memory_tensors,
                                       loader_workers, training_batches)
from tula_ray.training.run import fit
from tula_ray.workloads import Workload

SIZE, BATCH = 96, 8


def _tensors(size: int = SIZE) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(size, 1, 6, 6, generator=generator),
                         torch.randint(0, 4, (size,), generator=generator))


class PlainImages(Dataset):
    """A user's map-style dataset that is not a TensorDataset: one sample per call."""

    def __init__(self, size: int = SIZE) -> None:
        self.inputs, self.labels = _tensors(size).tensors

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.inputs[index], int(self.labels[index])


def _dataloader_batches(dataset, rank: int, epoch: int, replicas: int = 2) -> list:
    sampler = DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True,
                                 seed=5, drop_last=True)
    sampler.set_epoch(epoch)
    return list(DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=True))


@pytest.mark.parametrize("dataset", [_tensors(), Subset(_tensors(), range(3, 90)),
                                     Subset(Subset(_tensors(), range(80)), [5, 1, 9] * 9)],
                         ids=["tensors", "subset", "subset-of-subset"])
@pytest.mark.parametrize("rank", [0, 1])
def test_gathered_batches_are_the_dataloaders_in_its_order(dataset, rank):
    batches = training_batches(dataset, BATCH, "cpu", seed=5, num_replicas=2, rank=rank)
    assert batches.path == "gather-host"
    for epoch in (0, 1):
        batches.set_epoch(epoch)
        ours, torchs = list(batches), _dataloader_batches(dataset, rank, epoch)
        assert len(ours) == len(torchs) == len(batches)
        for (x, y), (tx, ty) in zip(ours, torchs):
            assert torch.equal(x, tx) and torch.equal(y, ty)


def test_a_plain_dataset_goes_through_a_dataloader_in_the_same_order():
    plain, tensors = PlainImages(), _tensors()
    batches = training_batches(plain, BATCH, "cpu", seed=5, num_replicas=2, rank=1)
    assert batches.path == "loader" and batches.loader.num_workers == 0  # CPU: no workers
    batches.set_epoch(1)
    gathered = training_batches(tensors, BATCH, "cpu", seed=5, num_replicas=2, rank=1)
    gathered.set_epoch(1)
    for (x, y), (gx, gy) in zip(batches, gathered, strict=True):
        assert torch.equal(x, gx) and torch.equal(y, gy)


def test_loader_workers_are_the_users_or_none_on_cpu():
    assert loader_workers(torch.device("cpu"), None) == 0
    assert loader_workers(torch.device("cpu"), 2) == 2
    with_workers = Batches(PlainImages(), BATCH, "cpu", workers=1)
    assert sum(len(y) for _, y in with_workers) == SIZE  # a worker process serves them


@pytest.mark.parametrize("replicas", [1, 3])
def test_evaluation_batches_cover_every_sample_once(replicas):
    dataset = _tensors(50)
    seen = torch.cat([y for rank in range(replicas)
                      for _, y in evaluation_batches(dataset, 7, "cpu", num_replicas=replicas,
                                                     rank=rank)])
    assert len(seen) == 50
    assert sorted(seen.tolist()) == sorted(dataset.tensors[1].tolist())


def test_only_tensor_datasets_of_inputs_and_targets_are_gathered():
    assert in_memory_tensors(PlainImages()) is None
    assert in_memory_tensors(TensorDataset(torch.zeros(4))) is None  # no targets
    tensors, index = in_memory_tensors(Subset(_tensors(), [4, 2]))
    assert index.tolist() == [4, 2] and len(tensors) == 2


@pytest.mark.parametrize("field, value, error", [
    ("loader_workers", -1, ValueError), ("loader_workers", 1.5, TypeError),
    ("pin_memory", "yes", TypeError), ("data_on_device", 1, TypeError)])
def test_bad_data_settings_name_the_value(field, value, error):
    with pytest.raises(error, match=f"{field}={value!r}"):
        Workload("mine", model_fn=_model, train_dataset_fn=_tensors, **{field: value})


def _model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 4))


def test_a_user_dataset_trains_as_its_tensors_would():
    """The same samples as a plain Dataset (DataLoader path) or as tensors (gather path):
    the same batches in the same order, so the very same training."""
    def workload(data_fn) -> Workload:
        return Workload("mine", model_fn=_model, train_dataset_fn=data_fn,
                        test_dataset_fn=lambda: _tensors(20), epochs=2)

    plain = fit(workload(PlainImages), global_batch=BATCH, strategy="lbt")
    tensors = fit(workload(_tensors), global_batch=BATCH, strategy="lbt")
    columns = ["train_loss", "train_accuracy", "test_loss"]
    pd.testing.assert_frame_equal(plain[columns], tensors[columns])


def test_only_data_kept_on_a_gpu_counts_in_the_memory_model():
    from tula_ray.training.batches import device_resident_bytes

    tensors = _tensors()
    assert device_resident_bytes(tensors, "cpu") == 0  # CPU training: nothing moves
    assert device_resident_bytes(PlainImages(), "cuda") == 0  # a DataLoader's: host memory
    assert device_resident_bytes(tensors, "cuda", on_device=False) == 0
    expected = sum(t.numel() * t.element_size() for t in tensors.tensors)
    assert device_resident_bytes(tensors, "cuda", on_device=True) == expected


def test_a_users_text_classifier_with_adam_runs_through_check_probe_and_training():
    """Issue 41: integer tokens in a Dataset of the user's own, an EmbeddingBag model and
    Adam pass the workload check (integer inputs kept integer), give the memory probe
    peaks that grow with the batch, and train inside AGS-NS with their Adam (a Ray run of
    the same workload: tests/test_profile_ray.py)."""
    from text_workload import TEXT_WORKLOAD

    from tula_ray.training import measure
    from tula_ray.workloads.check import complete, inspect_workload

    facts = inspect_workload(TEXT_WORKLOAD)
    assert facts.example[0].dtype == torch.int64
    workload = complete(TEXT_WORKLOAD, facts)
    assert workload.sample_shape == (16,) and workload.num_classes == 4
    peaks = [measure.peak_memory_bytes(workload, b, device="cpu", example=facts.example)
             for b in (8, 64)]
    assert 0 < peaks[0] < peaks[1]
    metrics = fit(workload, global_batch=64, strategy="ags-ns", epochs=3)
    assert metrics["optimizer"].eq("TulaOptimizer(Adam)").all()
    assert metrics["train_loss"].is_monotonic_decreasing  # Adam's steps, through AGS-NS
    assert metrics["test_accuracy"].between(0, 1).all()
