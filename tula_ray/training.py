"""The training loop shared by single-process runs (`fit`) and Ray Train workers.

`train_epoch` runs one pass of a strategy from `tula_ray.training_strategies`, `evaluate`
scores the test set, and `checkpoint_state` / `restore_state` save and resume
a run so that it continues exactly as if it had not stopped. Under
torch.distributed every rank returns the same metrics (sums and means are
all-reduced). `fit` is the single-process driver the benchmarks use.

Epochs are counted from 0 (as torch's `set_epoch` and Ray Train loops do). The
training order depends on (seed, epoch) only: the sampler's `set_epoch(epoch)`
reshuffles deterministically, so a resumed run sees the same batches. No Ray
here (core module).
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

from tula_ray.measure import StepTimer
from tula_ray.training_strategies import StrategySetup, base_optimizer, build_strategy
from tula_ray.workloads import (LR_DEFAULT, MOMENTUM_DEFAULT, WEIGHT_DECAY_DEFAULT, Workload,
                                resolve_workload)

logger = logging.getLogger(__name__)

EVAL_BATCH = 1000  # test-set batch: no gradients are kept, so it can exceed the training batch
COLUMNS = ("epoch", "strategy", "global_batch", "seed", "train_loss", "train_accuracy",
           "test_loss", "test_accuracy", "lr", "seconds", "scaled_fraction", "variability_median")
CHECKPOINT_KEYS = {"strategy", "epoch", "model", "optimizer", "scheduler", "comm_iter"}


def make_loaders(workload: Workload, batch: int, *, seed: int, num_replicas: int = 1,
                 rank: int = 0) -> tuple[DataLoader, DataLoader]:
    """(train, test) loaders for replica `rank` of `num_replicas`, `batch` samples per step each.

    Training: shuffled by a DistributedSampler seeded with `seed` (its `set_epoch`,
    called by `train_epoch`, makes the order a function of (seed, epoch)); the last
    incomplete batch is dropped. Test: this replica's contiguous share of the whole
    test set, unshuffled, so `evaluate`'s all-reduced sums cover every sample once.
    """
    train_set, test_set = workload.train_dataset_fn(), workload.test_dataset_fn()
    if len(train_set) < batch * num_replicas:  # type: ignore[arg-type]
        raise ValueError(f"batch={batch} x {num_replicas} replicas exceeds the training set "
                         f"({len(train_set)} samples): no full batch")  # type: ignore[arg-type]
    sampler = DistributedSampler(train_set, num_replicas=num_replicas, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    # The generator keeps the loader from drawing its base seed from the global RNG.
    train = DataLoader(train_set, batch_size=batch, sampler=sampler, drop_last=True,
                       generator=torch.Generator().manual_seed(seed))
    share = Subset(test_set, range(rank, len(test_set), num_replicas))  # type: ignore[arg-type]
    return train, DataLoader(share, batch_size=EVAL_BATCH, shuffle=False)


def train_epoch(model: nn.Module, setup: StrategySetup, loss_fn: Callable, loader: DataLoader,
                device: torch.device | str, *, epoch: int) -> dict[str, Any]:
    """One pass over `loader` with the strategy's optimizer and scheduler.

    Returns train_loss (mean over samples), train_accuracy (fraction), steps, lr
    (the LR of the last step), seconds (wall time); for "ags" also scaled_fraction
    (share of steps AGS scaled), variability_median (eq. 5, median over the steps),
    variability (eq. 5 at every step, a list of floats; inf at a run's first step,
    which has no previous norm) and the last step's scale_mean/min/max.
    Under torch.distributed the metrics are averaged over the ranks.
    """
    device = torch.device(device)
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)  # type: ignore[union-attr]
    ags, optimizer, scheduler = setup.name == "ags", setup.optimizer, setup.scheduler
    if ags:
        from tula_ray.ags import backward_with_refresh  # here: only AGS runs need it

        optimizer.start_epoch()  # type: ignore[attr-defined]
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    samples = steps = scaled_steps = 0
    variability: list[float] = []
    lr = math.nan
    with StepTimer(device) as timer:
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad(set_to_none=True)
            if ags:
                loss, outputs = backward_with_refresh(model, optimizer, loss_fn, inputs, targets)
            else:
                outputs = model(inputs)
                loss = loss_fn(outputs, targets)
                loss.backward()
            lr = float(base_optimizer(optimizer).param_groups[0]["lr"])  # the LR this step uses
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            loss_sum += loss.detach().double() * len(targets)
            correct += (outputs.detach().argmax(dim=1) == targets).sum()
            samples, steps = samples + len(targets), steps + 1
            if ags:
                telemetry = optimizer.telemetry  # type: ignore[attr-defined]
                variability.append(float(telemetry["variability"]))
                scaled_steps += bool(telemetry["scaled"])
    if steps == 0:
        raise ValueError(f"the loader gave no batch in epoch {epoch}: is the dataset smaller "
                         "than one batch (drop_last)?")
    total_loss, total_correct, total_samples = _sum_over_ranks(
        [loss_sum.item(), float(correct.item()), float(samples)], device)
    means = {"seconds": timer.seconds}
    if ags:
        means["scaled_fraction"] = scaled_steps / steps
        # inf (a run's first, sensitive step) sorts last: it shifts the median by one place.
        means["variability_median"] = float(np.median(variability))
    means = dict(zip(means, _mean_over_ranks(list(means.values()), device)))
    metrics: dict[str, Any] = {"train_loss": total_loss / total_samples,
                               "train_accuracy": total_correct / total_samples,
                               "steps": steps, "lr": lr, **means}
    if ags:
        telemetry = optimizer.telemetry  # type: ignore[attr-defined]
        metrics["variability"] = variability
        metrics.update({k: float(telemetry[k]) for k in ("scale_mean", "scale_min", "scale_max")})
    return metrics


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device | str,
             loss_fn: Callable) -> dict[str, float]:
    """test_loss (mean over samples) and test_accuracy of `model` over `loader`.

    Under torch.distributed the sums are all-reduced: give each rank its share of
    the test set (as `make_loaders` does) for the whole set, or the whole set on
    every rank (same result, more work). The model's train/eval mode is restored.
    """
    device = torch.device(device)
    module = _unwrap(model)  # a plain forward: no DDP buffer broadcast for evaluation
    was_training = module.training
    module.eval()
    loss_sum, correct, samples = 0.0, 0, 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        outputs = module(inputs)
        loss_sum += float(loss_fn(outputs, targets)) * len(targets)
        correct += int((outputs.argmax(dim=1) == targets).sum())
        samples += len(targets)
    module.train(was_training)
    loss_sum, correct, samples = _sum_over_ranks([loss_sum, float(correct), float(samples)], device)
    if samples == 0:
        raise ValueError("evaluate got an empty test set")
    return {"test_loss": loss_sum / samples, "test_accuracy": correct / samples}


def checkpoint_state(model: nn.Module, setup: StrategySetup, epoch: int) -> dict[str, Any]:
    """A snapshot after `epoch` (deep-copied, torch.save-able): the model unwrapped from
    DDP, the optimizer (AGS state included), the scheduler and PoLo's hook counter."""
    state = {"strategy": setup.name, "epoch": epoch, "model": _unwrap(model).state_dict(),
             "optimizer": setup.optimizer.state_dict(),
             "scheduler": None if setup.scheduler is None else setup.scheduler.state_dict(),
             "comm_iter": None if setup.comm_state is None else setup.comm_state.iter}
    return copy.deepcopy(state)  # state_dicts are views of live tensors that training mutates


def restore_state(state: dict[str, Any], model: nn.Module, setup: StrategySetup) -> int:
    """Load a `checkpoint_state` snapshot into a freshly built model and setup.

    Returns the next epoch to run. Raises ValueError if the snapshot is not one or
    belongs to another strategy.
    """
    if not isinstance(state, dict) or set(state) != CHECKPOINT_KEYS:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a training checkpoint: expected keys {sorted(CHECKPOINT_KEYS)}, "
                         f"got {got}")
    if state["strategy"] != setup.name:
        raise ValueError(f"checkpoint of strategy {state['strategy']!r} cannot resume a "
                         f"{setup.name!r} run; build the setup with {state['strategy']!r}")
    if (state["scheduler"] is None) != (setup.scheduler is None):
        raise ValueError("checkpoint and setup disagree on having an LR scheduler: build the "
                         "setup with the options and epochs of the checkpointed run")
    _unwrap(model).load_state_dict(state["model"])
    setup.optimizer.load_state_dict(state["optimizer"])
    # torch's load_state_dict replaces the inner optimizer's param_groups list, and
    # PostLocalSGDOptimizer does not re-share it (TulaOptimizer does): share it here.
    setup.optimizer.param_groups = base_optimizer(setup.optimizer).param_groups
    if setup.scheduler is not None:
        setup.scheduler.load_state_dict(state["scheduler"])
    if setup.comm_state is not None and state["comm_iter"] is not None:
        setup.comm_state.iter = state["comm_iter"]  # else the hook would all-reduce again
    return int(state["epoch"]) + 1


def optimizer_hyperparameters(workload: Workload) -> dict[str, float]:
    """lr, momentum and weight_decay of the workload's optimizer (paper §IV-B defaults).

    Read from the `defaults` of its optimizer_fn applied to one dummy parameter, so
    any torch optimizer factory works; a value it lacks (Adam has no momentum)
    falls back to the paper's, with a warning. The strategies build their own SGD.
    """
    defaults = workload.optimizer_fn([nn.Parameter(torch.zeros(1))]).defaults
    found = {}
    for name, default in (("lr", LR_DEFAULT), ("momentum", MOMENTUM_DEFAULT),
                          ("weight_decay", WEIGHT_DECAY_DEFAULT)):
        if name not in defaults:
            logger.warning("workload %s: its optimizer has no %s; using %s (paper §IV-B)",
                           workload.name, name, default)
        found[name] = float(defaults.get(name, default))
    return found


def fit(workload: str | Workload, *, global_batch: int, strategy: str = "ags",
        epochs: int | None = None, seed: int = 0, device: torch.device | str = "cpu",
        options: dict[str, Any] | None = None, lr: float | None = None,
        on_epoch: Callable[[dict[str, Any], nn.Module, StrategySetup], None] | None = None,
        ) -> pd.DataFrame:
    """Train `workload` in this process (world size 1, no Ray) and score it every epoch.

    Args:
        workload: a Workload or a built-in name (`tula_ray.workloads.get_workload`).
        global_batch: samples per optimizer step.
        strategy, options: see `tula_ray.training_strategies.build_strategy`.
        epochs: default the workload's.
        seed: seeds the model initialisation and the data order.
        lr: the base LR before any strategy scaling; None = the workload's (paper: 0.01).
        on_epoch: called after every epoch with (metrics, model, setup); metrics is the
            row plus train_epoch's extras (e.g. "variability" for ags), e.g. to checkpoint.
    Returns:
        One row per epoch with `COLUMNS`; scaled_fraction and variability_median are
        NaN except for ags. `.attrs["notes"]` holds the strategy's notes.
    """
    workload = resolve_workload(workload)
    epochs = workload.epochs if epochs is None else epochs
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch={global_batch!r}: must be an integer >= 1")
    steps_per_epoch = workload.dataset_size // global_batch
    if steps_per_epoch < 1:
        raise ValueError(f"global_batch={global_batch} exceeds the training set of "
                         f"{workload.name} ({workload.dataset_size} samples): no full batch")
    device = torch.device(device)
    torch.manual_seed(seed)
    model = workload.model_fn().to(device)
    hyper = optimizer_hyperparameters(workload)
    if lr is not None:
        hyper["lr"] = lr
    # Built before the data load so that a bad strategy or option fails at once.
    setup = build_strategy(strategy, model, global_batch=global_batch,
                           steps_per_epoch=steps_per_epoch, epochs=epochs, options=options, **hyper)
    train_loader, test_loader = make_loaders(workload, global_batch, seed=seed)
    loss_fn = workload.loss_fn()
    rows = []
    for epoch in range(epochs):
        metrics = train_epoch(model, setup, loss_fn, train_loader, device, epoch=epoch)
        metrics.update(evaluate(model, test_loader, device, loss_fn))
        row = {"epoch": epoch, "strategy": strategy, "global_batch": global_batch, "seed": seed,
               **{key: metrics.get(key, math.nan) for key in COLUMNS[4:]}}
        rows.append(row)
        logger.info("%s %s B=%d epoch %d: train loss %.4f, test accuracy %.4f (%.1f s)",
                    workload.name, strategy, global_batch, epoch, row["train_loss"],
                    row["test_accuracy"], row["seconds"])
        if on_epoch is not None:
            on_epoch({**metrics, **row}, model, setup)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame.attrs["notes"] = list(setup.notes)
    return frame


# --------------------------------------------------------------------------- helpers

def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _reduce_device(device: torch.device) -> torch.device:
    """Where a collective's tensor must live: NCCL takes CUDA tensors, gloo CPU ones."""
    if dist.get_backend() == "nccl":
        return device if device.type == "cuda" else torch.device(
            "cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sum_over_ranks(values: list[float], device: torch.device) -> list[float]:
    if not _distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_reduce_device(device))
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def _mean_over_ranks(values: list[float], device: torch.device) -> list[float]:
    if not _distributed():
        return values
    return [value / dist.get_world_size() for value in _sum_over_ranks(values, device)]
