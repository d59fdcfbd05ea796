"""Measuring the gradient noise while profiling (issue 25, item 1), whatever the training
strategy: untimed steps that take two gradients of the same model at once, one over b
samples and one over B, and feed their squared norms (summed over every tensor: one
scalar) to `tula_ray.models.noise_scale.NoiseAverage`.

  N >= 2 workers: each worker's own gradient (b = B / N, a backward under DDP's
      `no_sync`) and their mean (B), all-reduced here with the workers' squared norms in
      one flat buffer: what DDP's all-reduce would have given, and no comm hook on the
      profiled model (it would change the synced steps the profile times);
  N = 1: the two halves of the batch (b = B / 2 each) and their mean (B).
The weights do not move (no optimizer step): every pair is taken at the profiled point.
No Ray here (core module).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from tula_ray.models.noise_scale import NoiseAverage
from tula_ray.training.strategy_base import StrategySetup


def flat_gradient(params: list[nn.Parameter], loss_scale: float = 1.0) -> torch.Tensor:
    """Every parameter's gradient in one float32 vector (zeros where a tensor has none),
    divided by the loss scale it carries."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      .float() for p in params]) / loss_scale


def _backward(model: nn.Module, setup: StrategySetup, loss_fn: Callable, inputs: torch.Tensor,
              targets: torch.Tensor) -> None:
    """Fresh gradients of one batch: the plain step's backward (its autocast, its loss scale)."""
    model.zero_grad(set_to_none=True)
    setup.backward(model, loss_fn, inputs, targets)


def measure_gradient_noise(model: nn.Module, setup: StrategySetup, loss_fn: Callable,
                           batches: Iterator, steps: int, *, world_size: int = 1,
                           no_sync: Callable[[], contextlib.AbstractContextManager]
                           = contextlib.nullcontext) -> NoiseAverage:
    """`steps` pairs on the next batches of this worker (`steps` the same on every worker:
    each step all-reduces once when `world_size` > 1). Returns the running mean, the same
    on every worker; the gradients are left cleared."""
    average = NoiseAverage()
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(steps):
        inputs, targets = next(batches)
        scale = 1.0 if setup.scaler is None else float(setup.scaler.get_scale())
        if world_size > 1:
            with no_sync():
                _backward(model, setup, loss_fn, inputs, targets)
            local = flat_gradient(params, scale)
            buffer = torch.cat([local, local.square().sum().reshape(1)])
            dist.all_reduce(buffer)
            buffer /= world_size
            local_batch = len(inputs)
            average.update(buffer[-1].item(), local_batch,
                           buffer[:-1].square().sum().item(), local_batch * world_size)
        else:
            half = len(inputs) // 2
            if half < 1:
                break  # one sample: no pair to take
            halves = []
            for part in (slice(0, half), slice(half, 2 * half)):
                _backward(model, setup, loss_fn, inputs[part], targets[part])
                halves.append(flat_gradient(params, scale))
            small_sqr = (halves[0].square().sum() + halves[1].square().sum()) / 2
            average.update(small_sqr.item(), half,
                           ((halves[0] + halves[1]) / 2).square().sum().item(), 2 * half)
    model.zero_grad(set_to_none=True)
    return average
