"""The phases of a profiled batch (DESIGN "Data flow" step 3), one function each, under a
plain torch.distributed process group (Ray Train's, or any other): the warm-up's first
step (`first_step`) and the rest of it (`warm_up`), memory's step on CPU
(`memory_step`), the compute-only and synced blocks (`compute_only_block`,
`synced_block`, alternated by `compute_and_synced_steps`), the gradient noise
(`gradient_noise`) and what the training strategy adds to a step (`strategy_extra_s`).
`tula_ray.training.profile_sweep` runs them in order for each batch.

Every phase ends with the workers' agreement (`ProfiledTraining.agreement`,
`tula_ray.training.phase_agreement`): a failure on one worker raises on all of them at
the same point, with the same class. Steps are the data path's (`EpochTally.step`),
timed as they are queued (`tula_ray.training.step_timing`). No Ray here (core module).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from tula_ray.distributed import max_over_ranks, replicas_from_rank0, world_size
from tula_ray.models.noise_scale import NoiseAverage
from tula_ray.training.epochs import EpochTally
from tula_ray.training.gradient_noise import measure_gradient_noise
from tula_ray.training.measure import memtracker_peak_bytes, train_step
from tula_ray.training.online_noise import OnlineNoise, captured_comm_hook
from tula_ray.training.phase_agreement import PhaseAgreement
from tula_ray.training.step_timing import (alternating_blocks, max_measure_steps,
                                           mean_step_s, measured_step_count, time_block,
                                           warm_up as warm_up_steps)
from tula_ray.training.strategies import build_strategy, get_training_strategy
from tula_ray.training.strategy_base import StrategySetup, TrainingStrategy
from tula_ray.workloads import Workload

# The gradient-noise pairs per batch (untimed): at least this many, more while they fit in
# NOISE_SECONDS; each costs about one step.
NOISE_MIN_STEPS = 3
NOISE_SECONDS = 0.5

RunStep = Callable[[], None]  # one training step of the data path, on the next batch


@dataclass
class ProfiledTraining:
    """What every phase steps: the worker group's model (DDP-wrapped when it spans more
    than one worker), its plain step (`plain`: optimizer, autocast, loss scaler) and loss,
    the device, and the workers' agreement that ends each phase.
    prepare_model: how the launcher wraps a further model as it wrapped this one (Ray
    Train's `prepare_model`; `profile_sweep.data_parallel` without Ray).
    noise: the online noise scale `train` measures at every step (`attach_noise`), so
    the timed steps carry its work: its comm hook around DDP's all-reduce, its optimizer
    pre-hook, one worker's half-batch backward every so many steps (issue 43, item 3)."""

    model: nn.Module
    plain: StrategySetup
    loss_fn: Callable
    device: torch.device
    agreement: PhaseAgreement
    prepare_model: Callable[[nn.Module], nn.Module]
    distributed: bool = field(init=False)
    transition: int = field(init=False)
    noise: OnlineNoise | None = None

    def __post_init__(self) -> None:
        self.distributed = isinstance(self.model, nn.parallel.DistributedDataParallel)
        # With buffers (BatchNorm), DDP broadcasts them in the forward after a synced step.
        self.transition = int(self.distributed and any(True for _ in self.model.buffers()))

    def no_sync(self) -> contextlib.AbstractContextManager:
        """DDP's no_sync (no all-reduce in the backward); nothing without DDP."""
        return self.model.no_sync() if self.distributed else contextlib.nullcontext()

    def attach_noise(self) -> None:
        """The online noise scale on the plain step, as `prepare_run` attaches it (no
        strategy hook to wrap here: DDP's all-reduce)."""
        self.noise = OnlineNoise.attach(self.model, self.plain, self.loss_fn, local_batch=1)

    def tally(self, local_batch: int) -> EpochTally:
        """The plain steps at `local_batch`, `train`'s per-step noise work included."""
        before_step = None
        if self.noise is not None:
            self.noise.local_batch = local_batch
            before_step = self.noise.before_step
        return EpochTally(self.model, self.plain, self.loss_fn, self.device, before_step)


def agree_first_step_fits(step: Callable[[], list[float]], device: torch.device,
                          no_collective: contextlib.AbstractContextManager,
                          agreement: PhaseAgreement | None = None) -> list[float]:
    """Run `step` (one training step, inside `no_collective`: DDP's no_sync) on every
    worker, then agree over all workers whether it succeeded (`agreement`'s, or a new
    one's). Returns its timing; raises torch.OutOfMemoryError on EVERY worker when any
    one ran out, so that all of them mark the batch "oom" together instead of some
    waiting in a collective (any other failure: every worker raises its class)."""
    agreement = agreement or PhaseAgreement(device)
    return agreement.run("first step", step, inside=no_collective)


def first_step(training: ProfiledTraining, run_step: RunStep) -> list[float]:
    """The warm-up's first step, where memory peaks: without a collective, then agreed on
    (a worker out of memory inside DDP's all-reduce would leave its peers waiting in it
    until the process-group timeout). Its seconds, this worker's."""
    device = training.device
    return agree_first_step_fits(lambda: time_block(1, run_step, device), device,
                                 training.no_sync(), training.agreement)


def memory_step(training: ProfiledTraining, batches: Iterator) -> tuple[float, float]:
    """Memory's phase off CUDA: one untimed step of this worker's own model under
    MemTracker, on a real batch. Returns (the largest rank's peak bytes, this worker's
    seconds). The wrapped module trains alone (no DDP hooks, no collective); the batch
    is fetched before the tracker and registered with it: a fetch inside would count
    the whole dataset's storage, which the batch's samples view."""
    module = getattr(training.model, "module", training.model)
    optimizer, loss_fn = training.plain.optimizer, training.loss_fn

    def tracked() -> tuple[float, float]:
        started = time.perf_counter()
        inputs, targets = next(batches)
        peak = memtracker_peak_bytes(
            [lambda: train_step(module, optimizer, loss_fn, inputs, targets,
                                autocast=training.plain.autocast)],
            module, optimizer, inputs, targets)
        return float(peak), time.perf_counter() - started

    peak, seconds = training.agreement.run("memory step", tracked)
    (peak,) = max_over_ranks([peak], training.device)
    return peak, seconds


def warm_up(training: ProfiledTraining, run_step: RunStep, *, min_steps: int,
            min_seconds: float) -> tuple[list[float], float]:
    """The rest of the warm-up: `no_sync` steps until `min_steps` ran and `min_seconds`
    passed, then DDP's first synced steps. Returns (every step's seconds, the last
    `no_sync` step's seconds, the slowest rank's: what the timed steps count on)."""
    agree, device = training.agreement.run, training.device
    # No collective under no_sync: each worker may warm up for its own count of steps.
    settled = agree("warm-up", lambda: warm_up_steps(
        run_step, device, min_steps=min_steps, min_seconds=min_seconds),
        inside=training.no_sync())
    seconds = list(settled)
    if training.distributed:
        # DDP's first synced step, and the next, whose forward rebuilds the buckets
        # with a broadcast (once per model, even under no_sync): inside this phase, no
        # compute block below holds a collective.
        seconds += agree("first synced steps", lambda: time_block(
            2, run_step, device,
            before_wait=training.agreement.before_wait("first synced steps")))
    # The step count comes from an untracked step (MemTracker slows the one it watches).
    (settled_s,) = max_over_ranks([settled[-1]], device)
    return seconds, settled_s


def compute_only_block(training: ProfiledTraining, run_step: RunStep,
                       steps: int) -> list[float]:
    """`steps` steps under DDP's `no_sync()` (no all-reduce), each one's seconds."""
    return training.agreement.run("compute steps", lambda: time_block(
        steps, run_step, training.device, transition=training.transition),
        inside=training.no_sync())


def synced_block(training: ProfiledTraining, run_step: RunStep, steps: int) -> list[float]:
    """`steps` ordinary DDP steps (the all-reduce in the backward), each one's seconds."""
    return training.agreement.run("synced steps", lambda: time_block(
        steps, run_step, training.device, transition=training.transition,
        before_wait=training.agreement.before_wait("synced steps")))


def compute_and_synced_steps(training: ProfiledTraining, run_step: RunStep, steps: int
                             ) -> tuple[list[float], list[float]]:
    """(compute, synced) step seconds: compute-only and synced blocks alternated,
    `steps` of each; without DDP one list, the steps being the same."""
    compute, synced = alternating_blocks(
        lambda count: compute_only_block(training, run_step, count),
        (lambda count: synced_block(training, run_step, count)) if training.distributed
        else None, steps)
    return compute, (synced if training.distributed else compute)


def gradient_noise(training: ProfiledTraining, batches: Iterator, warm_s: float,
                   world_size: int) -> NoiseAverage:
    """Untimed: the gradient noise at this batch from pairs of a b- and a B-sample gradient
    of the same weights, as many as fit NOISE_SECONDS after a `warm_s` step (the same
    count on every worker: it all-reduces).

    The pairs set each worker's gradient against their mean, so every worker must hold
    the same weights: rank 0's are broadcast first. The compute-only blocks and the first
    step (under DDP's `no_sync`) let each replica step on its own gradient, and replicas
    apart add their difference to the gradients' spread: tr(Sigma) too large, |G|^2 too
    small, often below 0 (a search's three CNN rows at N = 2 all read |G|^2 < 0, 4
    standard errors under it, and the plan fell back to phi = 2060 where training measured
    12-146)."""
    device = training.device
    steps = measured_step_count(warm_s, NOISE_MIN_STEPS, NOISE_SECONDS,
                                max_measure_steps(device))

    def measure() -> NoiseAverage:
        if training.distributed:
            replicas_from_rank0(training.model)
        return measure_gradient_noise(
            training.model, training.plain, training.loss_fn, batches, steps,
            world_size=world_size if training.distributed else 1, no_sync=training.no_sync)

    return training.agreement.run("gradient noise", measure)


def strategy_batch(strategy: str | TrainingStrategy | None, options: dict[str, Any],
                   world_size: int, first_batch: int, dataset_size: int
                   ) -> tuple[int | None, dict[str, Any]]:
    """(global batch, options) at which the sweep measures the training strategy: the
    smallest from `first_batch` up (doubling) that the strategy takes as configured, its
    options unchanged and without notes; else the smallest where it changed its options
    (AGS switches its source where its small batch does not fit: still AGS, at another
    cost); else the smallest it takes at all (notes alone say it runs reduced there: AGS's
    plain steps at a B no larger than its reference batch, PoLo on one worker); (None, {})
    without a strategy or a batch."""
    if not strategy:
        return None, {}
    training_strategy = get_training_strategy(strategy)
    given = dict(options or {})
    changed, reduced = [], []
    global_batch = first_batch
    while global_batch <= dataset_size:
        try:
            checked, notes = training_strategy.check(world_size, global_batch, dict(given))
        except ValueError:
            checked, notes = None, []
        if checked == given and not notes:
            return global_batch, checked
        if checked is not None:
            (changed if checked != given else reduced).append((global_batch, checked))
        global_batch *= 2
    return (changed + reduced)[0] if changed or reduced else (None, {})


@dataclass(frozen=True)
class StrategyRun:
    """The training strategy as the strategy phase builds it: at `global_batch` with
    `options` (`strategy_batch`'s), for `epochs` of `steps_per_epoch` steps, on a fresh
    model of `workload` in its precision."""

    strategy: str | TrainingStrategy
    options: dict[str, Any]
    global_batch: int
    epochs: int
    steps_per_epoch: int
    workload: Workload


def strategy_extra_s(training: ProfiledTraining, run: StrategyRun, batches: Iterator, *,
                     min_steps: int, budget_s: float) -> float:
    """Seconds the training strategy adds to one step: the slowest worker's strategy mean
    less the slowest worker's plain mean, at `run.global_batch` (`batches`: its local
    batches). Both steps are the data path's, in alternating blocks sharing one phase's
    `budget_s` (at least `min_steps` each): a difference of two means on a shared
    machine is all drift when they are timed one after the other (searches here
    measured 2-9 ms for the same AGS-NS step so). Each part ends with the workers'
    agreement: the second model out of memory on one worker stops them all."""
    agree, device = training.agreement.run, training.device
    plain = training.tally(run.global_batch // world_size_of(training))
    first = agree("strategy: first plain step",
                  lambda: time_block(1, lambda: plain.step(*next(batches)), device))
    (first_s,) = max_over_ranks(first, device)
    # Plain and strategy steps share one phase's budget: its cost is what the plan needs.
    count = measured_step_count(first_s, min_steps, budget_s / 2)
    # The second model, built and placed without a collective, then wrapped (DDP's
    # broadcast, its buckets): each agreed on apart.
    model = agree("strategy: second model", lambda: run.workload.model_fn().to(device))
    tally = agree("strategy: setup", lambda: _strategy_tally(training, run, model))
    # The strategy's first step builds the optimizer's state: untimed. Each block's first
    # step after the other model's is untimed too (`training.transition`: BatchNorm's
    # buffers broadcast then, as in the compute and synced blocks).
    agree("strategy: first step", lambda: tally.step(*next(batches)))

    def block(label: str, steps: EpochTally) -> Callable[[int], list[float]]:
        return lambda count: agree(label, lambda: time_block(
            count, lambda: steps.step(*next(batches)), device,
            transition=training.transition,
            before_wait=training.agreement.before_wait(label)))

    plain_s, seconds = alternating_blocks(block("strategy: plain steps", plain),
                                          block("strategy: steps", tally), count)
    strategy_mean, plain_mean = max_over_ranks(
        [mean_step_s(seconds), mean_step_s(plain_s)], device)
    return strategy_mean - plain_mean


def _strategy_tally(training: ProfiledTraining, run: StrategyRun,
                    model: nn.Module) -> EpochTally:
    """The strategy's steps on `model` (the second model), wrapped as `train` wraps it
    (DDP), with the strategy's optimizer and hooks, in its precision."""
    wrapped = training.prepare_model(model)
    wrapped.train()
    with captured_comm_hook(wrapped) as comm_hook:  # wrapped by the noise's, as in `train`
        setup = build_strategy(
            get_training_strategy(run.strategy), wrapped, global_batch=run.global_batch,
            steps_per_epoch=run.steps_per_epoch, epochs=run.epochs, options=run.options,
            optimizer_fn=run.workload.optimizer_fn)
    setup.set_precision(run.workload.precision, training.device)  # as `train` sets it
    setup.start_epoch(0)
    if training.noise is None:
        return EpochTally(wrapped, setup, training.loss_fn, training.device)
    # The strategy's noise work, as `train` does it (AGS-NS's sub-batch reused on one
    # worker): the extra measured is the strategy's and its noise's over the plain ones.
    noise = OnlineNoise.attach(wrapped, setup, training.loss_fn,
                               run.global_batch // world_size_of(training), comm_hook)
    return EpochTally(wrapped, setup, training.loss_fn, training.device, noise.before_step)


def world_size_of(training: ProfiledTraining) -> int:
    """The workers the profiled model's steps are split over (1 without DDP)."""
    return world_size(training.model.process_group) if training.distributed else 1


__all__ = ["NOISE_MIN_STEPS", "NOISE_SECONDS", "ProfiledTraining", "StrategyRun",
           "agree_first_step_fits", "compute_and_synced_steps", "compute_only_block",
           "first_step", "gradient_noise", "memory_step", "strategy_batch",
           "strategy_extra_s", "synced_block", "warm_up"]
