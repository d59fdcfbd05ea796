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

`measure_noise_scale` takes the N = 1 pairs at a model the user trained (to the target
accuracy): the plan's `noise_scale` at that target. No Ray here (core module).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from tula_ray.arguments import check_int
from tula_ray.models.noise_scale import NoiseAverage
from tula_ray.training.batches import training_batches
from tula_ray.training.step_timing import cycle
from tula_ray.training.strategy_base import StrategySetup
from tula_ray.workloads import Workload, resolve_workload

logger = logging.getLogger(__name__)

# Pairs of one measurement: single points of 32 pairs along a run scattered by a factor of
# several, while pooled over ~5 of them (160 pairs) they matched the phi that fits the
# measured epochs (BENCHMARKS.md, noise-evolution and time to accuracy).
NOISE_PAIRS_DEFAULT = 160
NOISE_PAIR_BATCH_DEFAULT = 256  # each pair: two halves of 128 samples and their mean


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


def measure_noise_scale(workload: str | Workload, model: nn.Module | None = None, *,
                        state_dict: Mapping[str, Any] | None = None,
                        pairs: int = NOISE_PAIRS_DEFAULT,
                        batch: int = NOISE_PAIR_BATCH_DEFAULT, seed: int = 0,
                        device: torch.device | str = "cpu",
                        workload_options: dict[str, Any] | None = None) -> float:
    """The gradient noise scale phi = tr(Sigma) / |G|^2 of a model at its present weights,
    on the workload's training data: `pairs` pairs, each the two halves of a fresh batch
    of `batch` samples and their mean (the profile's estimator on one worker), pooled.
    One process, no Ray; the weights do not move.

    Measure it at the target accuracy (the model of a run that reached it, or its
    checkpoint's `state_dict`) and give it to `tula_ray.search(noise_scale=...)`, or to
    `tula-ray replay plan.json --noise-scale PHI`: phi grows as a model trains, and the
    plan's own (its profiles', on a barely trained model) suits early targets only.

    model: default the workload's fresh `model_fn()`; state_dict: weights loaded into it
    (e.g. `checkpoint["model"]`). Cost: about 2 x `pairs` backward passes of `batch` / 2.
    Raises ValueError when the pairs measured no signal (|G|^2 <= 0: the gradient is
    still within its noise at `batch`): more pairs, or a larger batch, resolve it.
    """
    check_int("pairs", pairs, minimum=1)
    check_int("batch", batch, minimum=2, hint="each pair splits it in two halves")
    workload = resolve_workload(workload, workload_options)
    device = torch.device(device)
    if model is None:
        torch.manual_seed(seed)
        model = workload.model_fn()
    if state_dict is not None:
        model.load_state_dict(state_dict)
    model = model.to(device)
    was_training = model.training
    model.train()  # as the training steps see it (BatchNorm's batch statistics)
    setup = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    setup.set_precision(workload.precision, device)
    dataset = workload.train_dataset_fn()
    if len(dataset) < batch:  # type: ignore[arg-type]
        raise ValueError(f"batch={batch} exceeds the training set of {workload.name} "
                         f"({len(dataset)} samples); give a smaller batch")  # type: ignore[arg-type]
    batches = cycle(training_batches(dataset, batch, device, seed=seed))
    try:
        average = measure_gradient_noise(model, setup, workload.loss_fn(), batches, pairs)
    finally:
        model.train(was_training)
    grad_sqr, grad_var = average.estimate()
    if not grad_sqr > 0:
        raise ValueError(f"{workload.name}: {average.steps} pairs of batch={batch} measured "
                         f"no gradient signal (|G|^2 = {grad_sqr:.3g}, tr(Sigma) = "
                         f"{grad_var:.3g}): measure with more pairs or a larger batch")
    logger.info("%s: |G|^2 = %.4g, tr(Sigma) = %.4g over %d pairs of %d samples: phi = %.4g",
                workload.name, grad_sqr, grad_var, average.steps, batch, average.noise_scale)
    return average.noise_scale
