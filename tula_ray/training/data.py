"""The data of a training run: its loaders (one shard per rank under torch.distributed)
and a validation split (the workload's own, or one held out of the training set: what
tuning and a run to a target are judged on). The order
depends on (seed, epoch) only: the sampler's `set_epoch(epoch)` reshuffles
deterministically, so a resumed run sees the same batches. No Ray here (core module).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Subset

from tula_ray.evaluation_schedule import held_out_size
from tula_ray.training.batches import Batches, evaluation_batches, training_batches
from tula_ray.workloads import Workload


# The held-out validation split (tuning) is drawn with its own fixed seed, not the run's:
# every trial of a tuning run, whatever its seed, is judged on the same samples.
VALIDATION_SPLIT_SEED = 0


def make_loaders(workload: Workload, batch: int, *, seed: int, num_replicas: int = 1,
                 rank: int = 0, device: torch.device | str = "cpu",
                 validation_fraction: float = 0.0) -> tuple[Batches, Batches]:
    """(train, evaluation) batches for replica `rank` of `num_replicas`, `batch` samples per
    step each, on `device`, by the one data path (`tula_ray.training.batches`) with the
    workload's loader settings (loader_workers, pin_memory, data_on_device).

    The evaluation set is the test set; with validation_fraction > 0 it is the
    validation split instead (`training_sets`: the workload's own `val_dataset_fn`, else
    that share of the TRAINING set, drawn with `VALIDATION_SPLIT_SEED`), and the test
    set stays untouched (tuning, and training to a target); training uses the rest.

    Training: shuffled by a DistributedSampler seeded with `seed` (its `set_epoch`,
    called by `train_epoch`, makes the order a function of (seed, epoch)); the last
    incomplete batch is dropped. Evaluation: this replica's share of the whole set,
    unshuffled, so `evaluate`'s all-reduced sums cover every sample once, in batches of
    `evaluation_batch(workload, batch)`.
    """
    train_set, validation_set = training_sets(workload, validation_fraction)
    if len(train_set) < batch * num_replicas:  # type: ignore[arg-type]
        raise ValueError(f"batch={batch} x {num_replicas} replicas exceeds the training set "
                         f"({len(train_set)} samples): no full batch")  # type: ignore[arg-type]
    train = training_batches(train_set, batch, device, seed=seed, num_replicas=num_replicas,
                             rank=rank, **loader_options(workload))
    if validation_set is None:
        return train, test_batches(workload, batch, num_replicas=num_replicas, rank=rank,
                                   device=device)
    return train, _evaluation_batches(validation_set, workload, batch, num_replicas, rank,
                                      device)


def training_sets(workload: Workload, validation_fraction: float) -> tuple[Any, Any | None]:
    """(training set, validation set or None): the workload's `val_dataset_fn` when it has
    one (its training set whole), else with validation_fraction > 0 a split of the
    training set (`split_validation`), else no validation set."""
    train_set = workload.train_dataset_fn()
    if validation_fraction and workload.val_dataset_fn is not None:
        return train_set, workload.val_dataset_fn()
    if validation_fraction:
        return split_validation(train_set, validation_fraction)
    return train_set, None


def test_batches(workload: Workload, batch: int, *, num_replicas: int = 1, rank: int = 0,
                 device: torch.device | str = "cpu") -> Batches:
    """This replica's share of the workload's test set, as `make_loaders` serves it."""
    return _evaluation_batches(workload.test_dataset_fn(), workload, batch, num_replicas, rank,
                               device)


def _evaluation_batches(dataset: Any, workload: Workload, batch: int, num_replicas: int,
                        rank: int, device: torch.device | str) -> Batches:
    return evaluation_batches(dataset, evaluation_batch(workload, batch), device,
                              num_replicas=num_replicas, rank=rank, **loader_options(workload))


def evaluation_batch(workload: Workload, local_batch: int) -> int:
    """The batch one worker evaluates in: the workload's `eval_batch`, else the training's
    `local_batch`. Not a fixed larger one: the search bounded the local batch by what the
    device holds and what the model takes (a model may refuse larger batches)."""
    return workload.eval_batch or local_batch


def loader_options(workload: Workload) -> dict[str, Any]:
    """The workload's data-path settings, as `tula_ray.training.batches.Batches` takes them."""
    return {"workers": workload.loader_workers, "pin_memory": workload.pin_memory,
            "on_device": workload.data_on_device}


def split_validation(dataset: Any, fraction: float) -> tuple[Subset, Subset]:
    """(training part, validation part) of `dataset`: `fraction` of it, at least one sample,
    drawn at random with `VALIDATION_SPLIT_SEED` (a dataset sorted by label still splits fairly)."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation_fraction={fraction!r}: need 0 < fraction < 1")
    size = len(dataset)
    held_out = held_out_size(size, fraction)
    if held_out >= size:
        raise ValueError(f"validation_fraction={fraction} leaves no training sample of {size}")
    order = torch.randperm(size, generator=torch.Generator().manual_seed(VALIDATION_SPLIT_SEED))
    return Subset(dataset, order[held_out:].tolist()), Subset(dataset, order[:held_out].tolist())
