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

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

from tula_ray.arguments import check_int
from tula_ray.distributed import mean_over_ranks, sum_over_ranks
from tula_ray.training.measure import StepTimer
from tula_ray.training.strategies import (TRAINING_STRATEGY_DEFAULT, StrategySetup,
                                          TrainingStrategy, base_optimizer, build_strategy,
                                          get_training_strategy)
from tula_ray.workloads.workload import (LR_DEFAULT, MOMENTUM_DEFAULT, WEIGHT_DECAY_DEFAULT, Workload,
                                resolve_workload)

logger = logging.getLogger(__name__)

EVAL_BATCH = 1000  # test-set batch: no gradients are kept, so it can exceed the training batch
# The held-out validation split (tuning) is drawn with its own fixed seed, not the run's:
# every trial of a tuning run, whatever its seed, is judged on the same samples.
VALIDATION_SPLIT_SEED = 0
COLUMNS = ("epoch", "strategy", "global_batch", "seed", "train_loss", "train_accuracy",
           "test_loss", "test_accuracy", "lr", "seconds", "scaled_fraction", "variability_median")
CHECKPOINT_KEYS = {"strategy", "epoch", "model", "optimizer", "scheduler", "comm_iter"}


def make_loaders(workload: Workload, batch: int, *, seed: int, num_replicas: int = 1,
                 rank: int = 0, pin_memory: bool = False, validation_fraction: float = 0.0
                 ) -> tuple[DataLoader, DataLoader]:
    """(train, test) loaders for replica `rank` of `num_replicas`, `batch` samples per step each.

    validation_fraction > 0: a split of that share of the TRAINING set (drawn with
    `VALIDATION_SPLIT_SEED`) is held out and served instead of the test set, which
    stays untouched (tuning: `tula_ray.tune_training`); training uses the rest.

    Training: shuffled by a DistributedSampler seeded with `seed` (its `set_epoch`,
    called by `train_epoch`, makes the order a function of (seed, epoch)); the last
    incomplete batch is dropped. Test: this replica's contiguous share of the whole
    test set, unshuffled, so `evaluate`'s all-reduced sums cover every sample once.
    pin_memory: page-locked batches, for faster copies to a CUDA device (`prepare_run`
    sets it when training on CUDA).
    """
    train_set = workload.train_dataset_fn()
    if validation_fraction:
        train_set, test_set = split_validation(train_set, validation_fraction)
    else:
        test_set = workload.test_dataset_fn()
    if len(train_set) < batch * num_replicas:  # type: ignore[arg-type]
        raise ValueError(f"batch={batch} x {num_replicas} replicas exceeds the training set "
                         f"({len(train_set)} samples): no full batch")  # type: ignore[arg-type]
    sampler = DistributedSampler(train_set, num_replicas=num_replicas, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    # The generator keeps the loader from drawing its base seed from the global RNG.
    train = DataLoader(train_set, batch_size=batch, sampler=sampler, drop_last=True,
                       generator=torch.Generator().manual_seed(seed), pin_memory=pin_memory)
    share = Subset(test_set, range(rank, len(test_set), num_replicas))  # type: ignore[arg-type]
    return train, DataLoader(share, batch_size=EVAL_BATCH, shuffle=False, pin_memory=pin_memory)


def split_validation(dataset: Any, fraction: float) -> tuple[Subset, Subset]:
    """(training part, validation part) of `dataset`: `fraction` of it, at least one sample,
    drawn at random with `VALIDATION_SPLIT_SEED` (a dataset sorted by label still splits fairly)."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation_fraction={fraction!r}: need 0 < fraction < 1")
    size = len(dataset)
    held_out = max(1, int(round(size * fraction)))
    if held_out >= size:
        raise ValueError(f"validation_fraction={fraction} leaves no training sample of {size}")
    order = torch.randperm(size, generator=torch.Generator().manual_seed(VALIDATION_SPLIT_SEED))
    return Subset(dataset, order[held_out:].tolist()), Subset(dataset, order[:held_out].tolist())


def train_epoch(model: nn.Module, setup: StrategySetup, loss_fn: Callable, loader: DataLoader,
                device: torch.device | str, *, epoch: int) -> dict[str, Any]:
    """One pass over `loader` with the strategy's hooks (`StrategySetup`).

    Returns train_loss (mean over samples), train_accuracy (fraction), steps, lr
    (the LR of the last step), seconds (wall time), and the strategy's own epoch
    metrics (`setup.epoch_metrics`; for AGS scaled_fraction, variability_median, the
    per-step variability list and the last scale statistics). Under
    torch.distributed the sums are all-reduced and the float metrics averaged over ranks.
    """
    device = torch.device(device)
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)  # type: ignore[union-attr]
    setup.start_epoch(epoch)
    model.train()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    samples = steps = 0
    telemetry: list[dict[str, Any]] = []
    lr = math.nan
    with StepTimer(device) as timer:
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            setup.optimizer.zero_grad(set_to_none=True)
            loss, outputs = setup.backward(model, loss_fn, inputs, targets)
            lr = float(base_optimizer(setup.optimizer).param_groups[0]["lr"])  # this step's LR
            setup.step()
            telemetry.append(setup.step_telemetry())
            loss_sum += loss.detach().double() * len(targets)
            correct += (outputs.detach().argmax(dim=1) == targets).sum()
            samples, steps = samples + len(targets), steps + 1
    if steps == 0:
        raise ValueError(f"the loader gave no batch in epoch {epoch}: is the dataset smaller "
                         "than one batch (drop_last)?")
    total_loss, total_correct, total_samples = sum_over_ranks(
        [loss_sum.item(), float(correct.item()), float(samples)], device)
    extra = setup.epoch_metrics(telemetry)
    means = {"seconds": timer.seconds,
             **{k: v for k, v in extra.items() if isinstance(v, float)}}
    means = dict(zip(means, mean_over_ranks(list(means.values()), device)))
    return {"train_loss": total_loss / total_samples,
            "train_accuracy": total_correct / total_samples, "steps": steps, "lr": lr,
            **extra, **means}


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
    loss_sum, correct, samples = sum_over_ranks([loss_sum, float(correct), float(samples)], device)
    if samples == 0:
        raise ValueError("evaluate got an empty test set")
    return {"test_loss": loss_sum / samples, "test_accuracy": correct / samples}


def checkpoint_state(model: nn.Module, setup: StrategySetup, epoch: int) -> dict[str, Any]:
    """A snapshot after `epoch` (torch.save-able, every tensor copied to the CPU): the model
    unwrapped from DDP, the optimizer (AGS state included), the scheduler and PoLo's hook
    counter. Copies go to the CPU, not next to the live tensors: a snapshot on the GPU
    would double the model's and optimizer's memory on the device."""
    state = {"strategy": setup.name, "epoch": epoch, "model": _unwrap(model).state_dict(),
             "optimizer": setup.optimizer.state_dict(),
             "scheduler": None if setup.scheduler is None else setup.scheduler.state_dict(),
             "comm_iter": None if setup.comm_state is None else setup.comm_state.iter}
    return cpu_copy(state)  # state_dicts are views of live tensors that training mutates


def cpu_copy(value: Any) -> Any:
    """`value` with every tensor in it copied to the CPU (dicts, lists, tuples walked)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(item) for item in value)
    return value


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


@dataclass
class Run:
    """Everything one training process needs, as `prepare_run` builds it."""

    workload: Workload
    model: nn.Module
    setup: StrategySetup
    train_loader: DataLoader
    test_loader: DataLoader
    loss_fn: Callable
    device: torch.device
    epochs: int


def prepare_run(workload: str | Workload, *, global_batch: int,
                strategy: str | TrainingStrategy = TRAINING_STRATEGY_DEFAULT,
                epochs: int | None = None,
                seed: int = 0, device: torch.device | str = "cpu",
                options: dict[str, Any] | None = None, lr: float | None = None,
                num_replicas: int = 1, rank: int = 0,
                wrap_model: Callable[[nn.Module], nn.Module] | None = None,
                prepare_loader: Callable[[DataLoader], DataLoader] | None = None,
                validation_fraction: float = 0.0) -> Run:
    """The model, strategy and loaders of one process of a run: shared by `fit` (one
    process) and the Ray Train worker loop (rank `rank` of `num_replicas`).

    wrap_model: puts the fresh model on its device and wraps it (Ray's `prepare_model`:
    DDP); default: `.to(device)`. prepare_loader: e.g. Ray's `prepare_data_loader`.
    validation_fraction > 0: train on the rest of the training set and evaluate on that
    held-out share of it instead of the test set (see `make_loaders`).
    The seed fixes the initial weights (the same on every rank) and the data order.
    """
    workload = resolve_workload(workload)
    epochs = workload.epochs if epochs is None else epochs
    check_int("global_batch", global_batch, minimum=1)
    if global_batch % num_replicas:
        raise ValueError(f"global_batch={global_batch} is not divisible by num_workers="
                         f"{num_replicas}; B must be a multiple of N")
    # Equal to len(train loader) per rank: floor(floor(D / N) / (B / N)) = floor(D / B).
    train_size = workload.dataset_size
    if validation_fraction:
        train_size -= max(1, int(round(train_size * validation_fraction)))
    steps_per_epoch = train_size // global_batch
    if steps_per_epoch < 1:
        raise ValueError(f"global_batch={global_batch} exceeds the training set of "
                         f"{workload.name} ({workload.dataset_size} samples): no full batch")
    device = torch.device(device)
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP also broadcasts them)
    model = workload.model_fn()
    model = model.to(device) if wrap_model is None else wrap_model(model)
    hyper = optimizer_hyperparameters(workload)
    if lr is not None:
        hyper["lr"] = lr
    # Built before the data load so that a bad strategy or option fails at once.
    setup = build_strategy(get_training_strategy(strategy), model, global_batch=global_batch,
                           steps_per_epoch=steps_per_epoch, epochs=epochs, options=options,
                           **hyper)
    train_loader, test_loader = make_loaders(
        workload, global_batch // num_replicas, seed=seed, num_replicas=num_replicas, rank=rank,
        pin_memory=device.type == "cuda", validation_fraction=validation_fraction)
    if prepare_loader is not None:
        train_loader, test_loader = prepare_loader(train_loader), prepare_loader(test_loader)
    return Run(workload, model, setup, train_loader, test_loader, workload.loss_fn(), device,
               epochs)


def fit(workload: str | Workload, *, global_batch: int,
        strategy: str | TrainingStrategy = TRAINING_STRATEGY_DEFAULT,
        epochs: int | None = None, seed: int = 0,
        device: torch.device | str = "cpu", options: dict[str, Any] | None = None,
        lr: float | None = None,
        on_epoch: Callable[[dict[str, Any], nn.Module, StrategySetup], None] | None = None,
        ) -> pd.DataFrame:
    """Train `workload` in this process (world size 1, no Ray) and score it every epoch.

    Args:
        workload: a Workload or a built-in name (`tula_ray.workloads.get_workload`).
        global_batch: samples per optimizer step.
        strategy, options: a registered strategy name or a TrainingStrategy, and its
            options (see `tula_ray.training_strategies`).
        epochs: default the workload's.
        seed: seeds the model initialisation and the data order.
        lr: the base LR before any strategy scaling; None = the workload's (paper: 0.01).
        on_epoch: called after every epoch with (metrics, model, setup); metrics is the
            row plus train_epoch's extras (e.g. "variability" for ags), e.g. to checkpoint.
    Returns:
        One row per epoch with `COLUMNS`; scaled_fraction and variability_median are
        NaN except for ags. `.attrs["notes"]` holds the strategy's notes.
    """
    run = prepare_run(workload, global_batch=global_batch, strategy=strategy, epochs=epochs,
                      seed=seed, device=device, options=options, lr=lr)
    rows = []
    for epoch in range(run.epochs):
        metrics = train_epoch(run.model, run.setup, run.loss_fn, run.train_loader, run.device,
                              epoch=epoch)
        metrics.update(evaluate(run.model, run.test_loader, run.device, run.loss_fn))
        row = {"epoch": epoch, "strategy": run.setup.name, "global_batch": global_batch,
               "seed": seed, **{key: metrics.get(key, math.nan) for key in COLUMNS[4:]}}
        rows.append(row)
        logger.info("%s %s B=%d epoch %d: train loss %.4f, test accuracy %.4f (%.1f s)",
                    run.workload.name, run.setup.name, global_batch, epoch, row["train_loss"],
                    row["test_accuracy"], row["seconds"])
        if on_epoch is not None:
            on_epoch({**metrics, **row}, run.model, run.setup)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame.attrs["notes"] = list(run.setup.notes)
    return frame


# --------------------------------------------------------------------------- helpers

def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
