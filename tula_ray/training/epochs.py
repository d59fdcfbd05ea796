"""One epoch of a training strategy (`train_epoch`) and one pass over an evaluation set
(`evaluate`). Under torch.distributed every rank returns the same metrics (sums and means
are all-reduced over the ranks). No Ray here (core module).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ContextManager, Iterable

import torch
from torch import nn

from tula_ray.distributed import mean_over_ranks, sum_over_ranks, unwrapped
from tula_ray.training.measure import StepTimer
from tula_ray.training.strategies import StrategySetup


class EpochTally:
    """An epoch's steps and their running sums, kept on the device (no host sync per
    step). `step` is the one training step of the data path that `train_epoch` runs and
    the profiling loop times: the strategy's step on a batch, then the epoch's sums."""

    def __init__(self, model: nn.Module, setup: StrategySetup, loss_fn: Callable,
                 device: torch.device | str,
                 before_step: Callable[[torch.Tensor, torch.Tensor], None] | None = None
                 ) -> None:
        self.model, self.setup, self.loss_fn = model, setup, loss_fn
        # Called with each batch before its step (the online noise scale's
        # `OnlineNoise.before_step`: its half-batch backward on one worker, when due).
        self.before_step = before_step
        self.device = torch.device(device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.correct = torch.zeros((), dtype=torch.int64, device=self.device)
        self.samples = self.steps = 0
        self.telemetry: list[dict[str, Any]] = []
        self.lr = math.nan

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        # A no-op for the data path's batches (already there); a plain DataLoader's move.
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        if self.before_step is not None:
            self.before_step(inputs, targets)
        loss, outputs, self.lr = self.setup.train_step(self.model, self.loss_fn, inputs, targets)
        self.telemetry.append(self.setup.step_telemetry())
        self.loss_sum += loss.detach().double() * len(targets)
        self.correct += (outputs.detach().argmax(dim=1) == targets).sum()
        self.samples, self.steps = self.samples + len(targets), self.steps + 1


def train_epoch(model: nn.Module, setup: StrategySetup, loss_fn: Callable, loader: Iterable,
                device: torch.device | str, *, epoch: int,
                after_step: Callable[[], bool] | None = None,
                before_step: Callable[[torch.Tensor, torch.Tensor], None] | None = None
                ) -> dict[str, Any]:
    """One pass over `loader` (`tula_ray.training.batches.Batches`, or a DataLoader) with
    the strategy's hooks (`StrategySetup`). after_step: called after every step; True
    ends the epoch there (a run that reached its target: `tula_ray.training.target`), and
    every rank must answer alike (they all stop at the same step). before_step: called
    with each batch before its step (`EpochTally`).

    Returns train_loss (mean over samples), train_accuracy (fraction), steps, lr
    (the LR of the last step), seconds (wall time of the pass, data included: what the
    plan's `epoch_time_s` predicts), and the strategy's own epoch
    metrics (`setup.epoch_metrics`; for AGS scaled_fraction, variability_median, the
    per-step variability list and the last scale statistics). Under
    torch.distributed the sums are all-reduced and the float metrics averaged over ranks.
    """
    device = torch.device(device)
    set_epoch = getattr(loader, "set_epoch", None) or getattr(
        getattr(loader, "sampler", None), "set_epoch", None)
    if set_epoch is not None:
        set_epoch(epoch)
    setup.start_epoch(epoch)
    model.train()
    tally = EpochTally(model, setup, loss_fn, device, before_step)
    with StepTimer(device) as timer:
        for inputs, targets in loader:
            tally.step(inputs, targets)
            if after_step is not None and after_step():
                break
    if tally.steps == 0:
        raise ValueError(f"the loader gave no batch in epoch {epoch}: is the dataset smaller "
                         "than one batch (drop_last)?")
    total_loss, total_correct, total_samples = sum_over_ranks(
        [tally.loss_sum.item(), float(tally.correct.item()), float(tally.samples)], device)
    extra = setup.epoch_metrics(tally.telemetry)
    means = {"seconds": timer.seconds,
             **{k: v for k, v in extra.items() if isinstance(v, float)}}
    means = dict(zip(means, mean_over_ranks(list(means.values()), device)))
    return {"train_loss": total_loss / total_samples,
            "train_accuracy": total_correct / total_samples, "steps": tally.steps,
            "lr": tally.lr, **extra, **means}


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device | str,
             loss_fn: Callable, *,
             autocast: Callable[[], ContextManager] = contextlib.nullcontext
             ) -> dict[str, float]:
    """test_loss (mean over samples) and test_accuracy of `model` over `loader`.

    Under torch.distributed the sums are all-reduced: give each rank its share of
    the test set (as `make_loaders` does) for the whole set, or the whole set on
    every rank (same result, more work). The model's train/eval mode is restored.
    """
    device = torch.device(device)
    module = unwrapped(model)  # a plain forward: no DDP buffer broadcast for evaluation
    was_training = module.training
    module.eval()
    loss_sum, correct, samples = 0.0, 0, 0
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast():  # the training's precision (`tula_ray.precision`)
            outputs = module(inputs)
            loss = loss_fn(outputs, targets)
        loss_sum += float(loss) * len(targets)
        correct += int((outputs.argmax(dim=1) == targets).sum())
        samples += len(targets)
    module.train(was_training)
    loss_sum, correct, samples = sum_over_ranks([loss_sum, float(correct), float(samples)], device)
    if samples == 0:
        raise ValueError("evaluate got an empty test set")
    return {"test_loss": loss_sum / samples, "test_accuracy": correct / samples}
