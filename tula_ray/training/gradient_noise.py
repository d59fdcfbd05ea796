"""Measuring the gradient noise while profiling (issue 25, item 1), whatever the training
strategy: untimed steps that take two gradients of the same model at once, one over b
samples and one over B, and feed their squared norms (summed over every tensor: one
scalar) to `tula_ray.models.noise_scale.NoiseAverage`.

  N >= 2 workers: each worker's own gradient (b = B / N, a backward under DDP's
      `no_sync`) and their mean (B), all-reduced here with the workers' squared norms in
      one flat buffer: what DDP's all-reduce would have given, the model's comm hook
      (the online noise scale's, which the profiled steps carry as `train`'s do) not
      called under no_sync;
  N = 1: the two halves of the batch (b = B / 2 each) and their mean (B).
The weights do not move (no optimizer step): every pair is taken at the profiled point.

`measure_noise_scale` takes the N = 1 pairs at a model the user trained (to the target
accuracy), spread over a short continuation of its training: the plan's `noise_scale` at
that target. No Ray here (core module).
"""

from __future__ import annotations

import contextlib
import copy
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

NOISE_PAIRS_DEFAULT = 160  # 3 measurements at one model agreed within 4 % (the CNN)
NOISE_PAIR_BATCH_DEFAULT = 256  # each pair: two halves of 128 samples and their mean
TRAIN_BATCH_DEFAULT = 32  # the continuation's batch: the plans' reference batch M0


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
                           = contextlib.nullcontext,
                           average: NoiseAverage | None = None) -> NoiseAverage:
    """`steps` pairs on the next batches of this worker (`steps` the same on every worker:
    each step all-reduces once when `world_size` > 1), added to `average` (default a new
    running mean). Returns it, the same on every worker; the gradients are left cleared."""
    average = NoiseAverage() if average is None else average
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(steps):
        inputs, targets = next(batches)
        scale = setup.loss_scale()
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
                        batch: int = NOISE_PAIR_BATCH_DEFAULT, steps: int = 0,
                        train_batch: int = TRAIN_BATCH_DEFAULT, seed: int = 0,
                        device: torch.device | str = "cpu",
                        workload_options: dict[str, Any] | None = None) -> float:
    """The gradient noise scale phi = tr(Sigma) / |G|^2 of a model near its present
    weights, on the workload's training data: `pairs` pairs, each the two halves of a
    fresh batch of `batch` samples and their mean (the profile's estimator on one
    worker), |G|^2 and tr(Sigma) pooled over them, then their ratio. One process, no Ray.

    steps > 0: a copy of the model trains on for `steps` steps of `train_batch` samples
    (the workload's optimizer, fresh; your reference batch), the pairs spread evenly over
    them: phi averaged over the iterates near these weights, as McCandlish et al. and
    AdaptDL average it over training steps. At one iterate phi is precise (3 measurements
    of the CNN within 4 %) but moves a lot from iterate to iterate, as |G|^2 does while
    SGD's iterate bounces across the valley (BENCHMARKS.md, time to accuracy: one
    iterate's phi against the window's). The model's weights never change (with
    `steps` 0 it is measured in place, so `device` moves it there, as `.to` does).

    Measure it at the target accuracy (the model of a run at the reference batch that
    reached it, or its checkpoint's `state_dict`, with `steps` about an epoch's) and give
    it to `tula_ray.search(noise_scale=...)` or `tula-ray replay plan.json --noise-scale
    PHI`: phi grows as a model trains, and the plan's own (its profiles', on a barely
    trained model) suits early targets only.

    model: default the workload's fresh `model_fn()`; state_dict: weights loaded into it
    (e.g. `checkpoint["model"]`). Cost: 2 x `pairs` backward passes of `batch` / 2, plus
    `steps` training steps.
    Raises ValueError when the pairs measured no signal (|G|^2 <= 0: the gradient is
    still within its noise at `batch`): more pairs, or a larger batch, resolve it.
    """
    check_int("pairs", pairs, minimum=1)
    check_int("batch", batch, minimum=2, hint="each pair splits it in two halves")
    check_int("steps", steps, minimum=0)
    check_int("train_batch", train_batch, minimum=1)
    workload = resolve_workload(workload, workload_options)
    device = torch.device(device)
    if model is None:
        torch.manual_seed(seed)
        model = workload.model_fn()
    if state_dict is not None:
        model.load_state_dict(state_dict)
    dataset = workload.train_dataset_fn()
    samples = len(dataset)  # type: ignore[arg-type]
    for name, size in (("batch", batch), ("train_batch", train_batch if steps else 1)):
        if samples < size:
            raise ValueError(f"{name}={size} exceeds the training set of {workload.name} "
                             f"({samples} samples); give a smaller {name}")
    was_training = model.training
    measured = (copy.deepcopy(model) if steps else model).to(device)
    measured.train()  # as the training steps see it (BatchNorm's batch statistics)
    try:
        average = pairs_along(workload, measured, dataset, pairs, batch, steps, train_batch,
                              seed, device)
    finally:
        model.train(was_training)
    grad_sqr, grad_var = average.estimate()
    if not grad_sqr > 0:
        raise ValueError(f"{workload.name}: {average.steps} pairs of batch={batch} measured "
                         f"no gradient signal (|G|^2 = {grad_sqr:.3g}, tr(Sigma) = "
                         f"{grad_var:.3g}): measure with more pairs or a larger batch")
    logger.info("%s: |G|^2 = %.4g, tr(Sigma) = %.4g over %d pairs of %d samples (%d steps): "
                "phi = %.4g", workload.name, grad_sqr, grad_var, average.steps, batch, steps,
                average.noise_scale)
    return average.noise_scale


def pairs_along(workload: Workload, model: nn.Module, dataset, pairs: int, batch: int,
                steps: int, train_batch: int, seed: int, device: torch.device,
                average: NoiseAverage | None = None) -> NoiseAverage:
    """`pairs` pairs at `model`, spread evenly over `steps` training steps of it, added to
    `average` (default a new running mean): `measure_noise_scale`'s measurement."""
    setup = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    setup.set_precision(workload.precision, device)
    loss_fn = workload.loss_fn()
    probes = cycle(training_batches(dataset, batch, device, seed=seed))
    training = cycle(training_batches(dataset, train_batch, device, seed=seed + 1)) \
        if steps else iter(())
    average, done = NoiseAverage() if average is None else average, 0
    for index in range(pairs):
        for _ in range(index * steps // pairs - done):  # to this pair's iterate
            setup.train_step(model, loss_fn, *next(training))
            done += 1
        measure_gradient_noise(model, setup, loss_fn, probes, 1, average=average)
    return average
