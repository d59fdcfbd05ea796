"""One epoch of a training strategy (`train_epoch`) and one pass over an evaluation set
(`evaluate`). Under torch.distributed every rank returns the same metrics (sums and means
are all-reduced over the ranks). No Ray here (core module).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from tula_ray.distributed import mean_over_ranks, sum_over_ranks, unwrapped
from tula_ray.training.measure import StepTimer
from tula_ray.training.strategies import StrategySetup


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
            loss, outputs, lr = setup.train_step(model, loss_fn, inputs, targets)
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
    module = unwrapped(model)  # a plain forward: no DDP buffer broadcast for evaluation
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
