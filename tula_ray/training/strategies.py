"""Large-batch training strategies as objects: AGS and the paper's four baselines (§IV-D).

A strategy (the `TrainingStrategy` protocol) carries, in one object:
  - `options`: the names of the options it accepts (validated by `check`);
  - `check(num_workers, global_batch, options)`: its rules on N and B, before any
    worker starts; it returns the options the run will use and notes on what it changed;
  - `build(model, ...)`: the optimizer and LR scheduler, as a `StrategySetup`, whose
    methods are the step hooks `train_epoch` calls (start of epoch, backward, step,
    telemetry); the epoch loop knows no strategy by name.

Registered in one place, `TRAINING_STRATEGIES` (`register_training_strategy` adds a fifth):
  "ags"   the workload's optimizer wrapped in `TulaOptimizer` (Algorithm 1;
          tula_ray.training.ags_strategy);
  "ags-ns" the same wrapper with the options of AGS-NS, the variant beyond the paper;
  "lbt"   vanilla large-batch training: the workload's optimizer at B, LR unchanged;
  "lrs"   the workload's optimizer at lr * B / 128 with a linear warm-up (Goyal et al., [7]);
  "lars"  `pytorch_optimizer.LARS` with the same scaled LR and warm-up, from the
          workload's SGD (another optimizer is refused: `base_optimizers`);
  "polo"  post-local SGD (Lin et al., [33]): torch's `PostLocalSGDOptimizer` around the
          workload's optimizer, `PeriodicModelAverager` and DDP's `post_localSGD_hook`,
          with the warm-up.
The workload's optimizer is its `optimizer_fn` (default the paper's SGD), so what a user
wrote is what trains, and what profiling timed.

Baselines are maintained library code (DESIGN "AGS"), not copies. Every
scheduler is a torch LR scheduler stepped once per optimizer step. Where the
run cannot follow the paper's recipe (fewer epochs than the warm-up, PoLo on
one worker, ...) the setup says so in `notes` and in the log; nothing is
dropped silently. No Ray here (core module).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
from torch import nn

from tula_ray.arguments import check_int, check_number, check_text
from tula_ray.distributed import world_size
from tula_ray.training.ags_strategy import AdaptiveGradientScaling, NoiseScaleAGS
from tula_ray.training.strategy_base import (BaseStrategy, OptimizerFactory, StrategySetup,
                                             TrainingStrategy, base_optimizer,
                                             check_base_optimizer, check_option_names,
                                             keep_lr, linear_rescale,
                                             optimizer_at_lr, probe_optimizer, scale_lr,
                                             takes_optimizer_fn)
from tula_ray.workloads import LR_DEFAULT, MOMENTUM_DEFAULT, WEIGHT_DECAY_DEFAULT, sgd

logger = logging.getLogger(__name__)

BASE_BATCH_DEFAULT = 128  # paper §IV-D: LRS and LARS scale the LR linearly from a base batch 128
WARMUP_EPOCHS_DEFAULT = 5  # paper §IV-D: LRS, LARS and PoLo warm the LR up for 5 epochs
POLO_SWITCH_EPOCH = 5  # paper §IV-D: PoLo goes local after 5 epochs ...
POLO_AVERAGES_PER_EPOCH = 4  # ... and averages the models 4 times per epoch
# LARS trust coefficient eta; the paper (§IV-D) gives none. pytorch_optimizer's default
# 1e-3 (You et al., 2017) goes with LRs ~10: at this LR (0.01 x B/128) a step moves a
# layer by lr * eta * |w|, and a smoke run's loss barely moved (2.3041 -> 2.3037 while
# LBT's fell). 0.02 is NVIDIA apex LARC's default.
LARS_TRUST_COEFFICIENT_DEFAULT = 0.02


# --------------------------------------------------------------------------- the registry

TRAINING_STRATEGIES: dict[str, TrainingStrategy] = {}
# What tula_ray.train, fit, tune_training and the search's measured step cost use by
# default (the CLI, which does not import torch at start-up, repeats it in its --strategy).
# AGS-NS: in the Table I analog (BENCHMARKS.md) its recipe is the best at B = 512 and 2048,
# 0.5 points under LRS at 1024, and no seed diverged; LRS diverged in 2 of 3 seeds at 2048,
# and the paper's literal AGS trails by up to 6.5 points.
TRAINING_STRATEGY_DEFAULT = "ags-ns"


def register_training_strategy(strategy: TrainingStrategy) -> TrainingStrategy:
    """Add a strategy under `strategy.name` (e.g. a user's fifth); returns it.

    Ray workers rebuild the registry on import: a strategy registered only in a
    driver reaches them when `tula_ray.train` is given the object itself."""
    if not isinstance(strategy, TrainingStrategy):
        raise TypeError(f"{strategy!r} is not a TrainingStrategy: it needs name, options, "
                        "check() and build()")
    check_text("strategy.name", strategy.name, hint="the name it is registered under")
    if strategy.name in TRAINING_STRATEGIES:
        raise ValueError(f"a strategy named {strategy.name!r} is registered already; "
                         "unregister_training_strategy it first")
    TRAINING_STRATEGIES[strategy.name] = strategy
    return strategy


def unregister_training_strategy(name: str) -> None:
    """Remove a registered strategy (tests clean up after themselves with this)."""
    TRAINING_STRATEGIES.pop(name, None)


def get_training_strategy(strategy: str | TrainingStrategy) -> TrainingStrategy:
    """A registered strategy by name, or the object itself."""
    if isinstance(strategy, str):
        if strategy not in TRAINING_STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is unknown; use one of "
                             f"{tuple(TRAINING_STRATEGIES)}")
        return TRAINING_STRATEGIES[strategy]
    if isinstance(strategy, TrainingStrategy):
        return strategy
    raise TypeError(f"strategy must be a name or a TrainingStrategy, not "
                    f"{type(strategy).__name__}")


def refusals(strategy: str | TrainingStrategy, options: dict[str, Any] | None,
             candidates: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The (N, B) among `candidates` that `strategy` with `options` cannot train, each with
    its `check`'s reason: what a plan must not choose (issue 22, item 6)."""
    strategy = get_training_strategy(strategy)
    refused = {}
    for num_workers, global_batch in candidates:
        try:
            strategy.check(int(num_workers), int(global_batch), dict(options or {}))
        except ValueError as exc:
            refused[(int(num_workers), int(global_batch))] = str(exc)
    return refused


def plain_steps(strategy: str | TrainingStrategy, options: dict[str, Any] | None,
                candidates: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """The (N, B) among `candidates` at which `strategy` with `options` trains plain SGD
    steps (AGS at a B no larger than its reference batch: nothing to scale), where its own
    cost per step is none; a strategy says so with `trains_plain(N, B, options)`, optional
    (a user's strategy without it is taken to add its cost everywhere)."""
    strategy = get_training_strategy(strategy)
    trains_plain = getattr(strategy, "trains_plain", None)
    if trains_plain is None:
        return set()
    found = set()
    for num_workers, global_batch in candidates:
        try:
            checked, _ = strategy.check(int(num_workers), int(global_batch),
                                        dict(options or {}))
        except ValueError:
            continue  # refused: `refusals` says why
        if trains_plain(int(num_workers), int(global_batch), checked):
            found.add((int(num_workers), int(global_batch)))
    return found


def build_strategy(name: str | TrainingStrategy, model: nn.Module, *, global_batch: int,
                   steps_per_epoch: int, epochs: int, lr: float | None = None,
                   momentum: float | None = None, weight_decay: float | None = None,
                   optimizer_fn: OptimizerFactory | None = None,
                   options: dict[str, Any] | None = None) -> StrategySetup:
    """The optimizer, scheduler and hooks of strategy `name` for `model` at `global_batch`.

    Args:
        name: a registered name (`TRAINING_STRATEGIES`) or a TrainingStrategy.
        model: the model to train, already on its device; DDP-wrapped under torch.distributed.
        global_batch: B, samples per optimizer step summed over all workers.
        steps_per_epoch: optimizer steps per epoch (dataset size // B with drop_last).
        epochs: epochs the run will train (the warm-up is clamped to it).
        optimizer_fn: the workload's optimizer (params -> torch optimizer), which the
            strategy wraps (AGS, AGS-NS, LBT, PoLo) or scales (LRS); default the paper's
            SGD (§IV-B) with `momentum` and `weight_decay`.
        lr: the base LR before any strategy scaling; the optimizer's own LR is moved to it
            (each param group alike). None: optimizer_fn's own, or the paper's 0.01.
        momentum, weight_decay: the default SGD's (ignored with optimizer_fn, whose own
            hyper-parameters a strategy that builds its own optimizer, LARS, reads).
        options: strategy-specific, see each strategy's `options`.
    Raises:
        ValueError: unknown strategy or option, a value out of range, or a workload
            optimizer the strategy cannot train with (its `base_optimizers`).
        TypeError: a value of the wrong type (e.g. global_batch=64.0).
    """
    strategy = get_training_strategy(name)
    options = check_option_names(strategy, options)
    for label, value in (("global_batch", global_batch), ("steps_per_epoch", steps_per_epoch),
                         ("epochs", epochs)):
        check_int(label, value, minimum=1)
    if lr is not None:
        check_number("lr", lr, low=0.0, low_open=True, hint="the learning rate")
    if optimizer_fn is None:
        optimizer_fn = default_sgd(momentum, weight_decay)
        lr = LR_DEFAULT if lr is None else lr
    optimizer_fn = optimizer_at_lr(optimizer_fn, lr)
    check_base_optimizer(strategy, optimizer_fn)
    arguments = dict(global_batch=global_batch, steps_per_epoch=steps_per_epoch, epochs=epochs,
                     options=options, **optimizer_hyperparameters(optimizer_fn))
    wraps = takes_optimizer_fn(strategy)  # a build written before optimizer_fn does not
    setup = strategy.build(model, **arguments, **({"optimizer_fn": optimizer_fn} if wraps else {}))
    if not wraps:
        setup.notes.append(f"strategy {setup.name!r} builds its own optimizer (its build takes "
                           f"no optimizer_fn), not the workload's")
    for note in setup.notes:
        logger.warning("strategy %s: %s", setup.name, note)
    return setup


def default_sgd(momentum: float | None = None,
                weight_decay: float | None = None) -> OptimizerFactory:
    """The paper's SGD (§IV-B) at the paper's LR, with these momentum and weight decay."""
    momentum = MOMENTUM_DEFAULT if momentum is None else momentum
    weight_decay = WEIGHT_DECAY_DEFAULT if weight_decay is None else weight_decay
    return lambda params: sgd(params, LR_DEFAULT, momentum, weight_decay)


def optimizer_hyperparameters(optimizer_fn: OptimizerFactory) -> dict[str, float]:
    """lr, momentum and weight_decay of what `optimizer_fn` builds, from its `defaults` on
    one dummy parameter; one it lacks (Adam has no momentum) is the paper's (§IV-B). Only a
    strategy that builds its own optimizer (LARS, from an SGD) uses them."""
    defaults = probe_optimizer(optimizer_fn).defaults
    return {name: float(defaults.get(name, default))
            for name, default in (("lr", LR_DEFAULT), ("momentum", MOMENTUM_DEFAULT),
                                  ("weight_decay", WEIGHT_DECAY_DEFAULT))}


# --------------------------------------------------------------------------- helpers

def linear_scaled_lr(lr: float, global_batch: int, base_batch: int = BASE_BATCH_DEFAULT) -> float:
    """Linear scaling rule (Goyal et al.; paper §IV-D): lr * global_batch / base_batch."""
    return lr * global_batch / base_batch


def warmup_scheduler(optimizer: torch.optim.Optimizer, *, warmup_steps: int, global_batch: int,
                     base_batch: int = BASE_BATCH_DEFAULT
                     ) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A linear warm-up to the optimizer's current LR over `warmup_steps` optimizer steps.

    It starts at that LR * base_batch / global_batch: for LRS and LARS that is the
    unscaled LR, where Goyal et al.'s gradual warm-up starts; PoLo, which does not
    scale, gets the same relative ramp (the paper gives no start value). At
    global_batch <= base_batch there is nothing to ramp up from: the LR stays flat.
    After the warm-up the LR stays at its target (torch's LinearLR). None without steps.
    """
    if warmup_steps <= 0:
        return None
    start_factor = min(1.0, base_batch / global_batch)
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=start_factor, end_factor=1.0,
                                             total_iters=warmup_steps)


def _warmup(options: dict[str, Any], epochs: int, steps_per_epoch: int,
            notes: list[str]) -> tuple[int, int]:
    """(base_batch, warm-up steps) of the LRS/LARS/PoLo recipe, clamped to the run."""
    base_batch = options.get("base_batch", BASE_BATCH_DEFAULT)
    check_int("base_batch", base_batch, minimum=1)
    warmup_epochs = options.get("warmup_epochs", WARMUP_EPOCHS_DEFAULT)
    check_int("warmup_epochs", warmup_epochs, minimum=0)
    if warmup_epochs > epochs:
        notes.append(f"warm-up clamped from {warmup_epochs} to {epochs} epochs: the run has "
                     f"only {epochs} (paper §IV-D warms up for {WARMUP_EPOCHS_DEFAULT})")
        warmup_epochs = epochs
    return base_batch, warmup_epochs * steps_per_epoch


# --------------------------------------------------------------------------- the baselines

class LargeBatchTraining(BaseStrategy):
    """"lbt": the workload's optimizer at the large batch, LR unchanged."""

    name, options = "lbt", ()

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options, optimizer_fn) -> StrategySetup:
        return StrategySetup(self.name, optimizer_fn(model.parameters()), rescale=keep_lr)


class LinearScaling(BaseStrategy):
    """"lrs" (the workload's optimizer) and "lars" (pytorch_optimizer.LARS, from the
    workload's SGD): LR x B / base_batch, linear warm-up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.options = ("base_batch", "warmup_epochs") + (
            ("trust_coefficient",) if name == "lars" else ())
        # LARS is SGD with a layer-wise trust ratio: it takes an SGD's lr and momentum.
        self.base_optimizers = (torch.optim.SGD,) if name == "lars" else ()

    def search_space(self, global_batch: int) -> dict[str, tuple[Any, ...]]:
        """The base LR (scaled by B / 128 after sampling: the range is the unscaled one,
        so a tenth of the others'), and LARS's trust coefficient (never swept before)."""
        space: dict[str, tuple[Any, ...]] = {"lr": ("loguniform", 1e-4, 0.05)}
        if self.name == "lars":
            space["trust_coefficient"] = ("loguniform", 1e-3, 0.1)
        return space

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options, optimizer_fn) -> StrategySetup:
        notes: list[str] = []
        base_batch, warmup_steps = _warmup(options, epochs, steps_per_epoch, notes)
        scaled = linear_scaled_lr(lr, global_batch, base_batch)
        if self.name == "lrs":  # the workload's optimizer, every group's LR x B / base_batch
            optimizer = optimizer_fn(model.parameters())
            scale_lr(optimizer, global_batch / base_batch)
        else:
            from pytorch_optimizer import LARS  # here: only this baseline pays for its import

            trust = options.get("trust_coefficient", LARS_TRUST_COEFFICIENT_DEFAULT)
            check_number("trust_coefficient", trust, low=0.0, low_open=True,
                         hint=f"default {LARS_TRUST_COEFFICIENT_DEFAULT}")
            optimizer = LARS(model.parameters(), lr=scaled, momentum=momentum,
                             weight_decay=weight_decay, trust_coefficient=trust)
        scheduler = warmup_scheduler(optimizer, warmup_steps=warmup_steps,
                                     global_batch=global_batch, base_batch=base_batch)
        return StrategySetup(self.name, optimizer, scheduler, notes,
                             rescale=linear_rescale(optimizer, scheduler))


class PostLocalSGD(BaseStrategy):
    """"polo": synchronous, then local SGD with periodic model averaging (needs DDP, N >= 2)."""

    # base_batch sets where PoLo's warm-up starts (see `warmup_scheduler`); PoLo does not scale.
    name, options = "polo", ("switch_epoch", "averages_per_epoch", "warmup_epochs", "base_batch")

    def check(self, num_workers, global_batch, options):
        options = check_option_names(self, options)
        notes = [] if num_workers >= 2 else [
            "polo at N=1 is plain steps of the workload's optimizer with the warm-up: there "
            "are no replicas to go local on"]
        return options, notes

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options, optimizer_fn) -> StrategySetup:
        notes: list[str] = []
        base_batch, warmup_steps = _warmup(options, epochs, steps_per_epoch, notes)
        # The warm-up schedules the workload's optimizer, whose step the PoLo wrapper calls.
        local = optimizer_fn(model.parameters())
        scheduler = warmup_scheduler(local, warmup_steps=warmup_steps, global_batch=global_batch,
                                     base_batch=base_batch)
        optimizer, comm_state = _polo(model, local, steps_per_epoch, epochs, options, notes)
        return StrategySetup(self.name, optimizer, scheduler, notes, comm_state)


def _polo(model: nn.Module, local: torch.optim.Optimizer, steps_per_epoch: int, epochs: int,
          options: dict[str, Any], notes: list[str]) -> tuple[torch.optim.Optimizer, Any]:
    """PostLocalSGDOptimizer + PeriodicModelAverager + DDP's post-local-SGD hook (world > 1)."""
    switch_epoch = options.get("switch_epoch", POLO_SWITCH_EPOCH)
    check_int("switch_epoch", switch_epoch, minimum=0)
    averages = options.get("averages_per_epoch", POLO_AVERAGES_PER_EPOCH)
    check_int("averages_per_epoch", averages, minimum=1)
    if world_size() < 2:
        notes.append("polo at world size 1 is plain steps of the workload's optimizer with the "
                     "warm-up: there are no replicas to go local on or to average")
        return local, None
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValueError(f"polo under torch.distributed (world size {world_size()}) needs a "
                         f"DistributedDataParallel model to register its comm hook; got "
                         f"{type(model).__name__}: wrap it in DDP before build_strategy")
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                                post_localSGD_hook)
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    switch_step = switch_epoch * steps_per_epoch
    period = steps_per_epoch // averages
    if period < 1:
        notes.append(f"polo averages every step: {steps_per_epoch} steps per epoch are fewer "
                     f"than averages_per_epoch={averages}")
        period = 1
    if switch_epoch >= epochs:
        notes.append(f"polo never goes local: it switches after epoch {switch_epoch} and the run "
                     f"has {epochs} epochs (synchronous SGD throughout)")
    # Local SGD means no gradient all-reduce after the switch. torch's default
    # subgroup is "the ranks of one node", sized by the accelerator count (it raises
    # on CPU); the paper's nodes held one GPU each, so each worker is its own local
    # group: post_local_gradient_allreduce=False gives exactly that, on any device.
    state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=switch_step,
                              post_local_gradient_allreduce=False)
    model.register_comm_hook(state, post_localSGD_hook)
    averager = PeriodicModelAverager(period=period, warmup_steps=switch_step)
    return PostLocalSGDOptimizer(local, averager), state


for _strategy in (AdaptiveGradientScaling(), NoiseScaleAGS(), LargeBatchTraining(),
                  LinearScaling("lrs"), LinearScaling("lars"), PostLocalSGD()):
    register_training_strategy(_strategy)
BUILT_IN_TRAINING_STRATEGIES = frozenset(TRAINING_STRATEGIES)  # every process knows these


def portable_training_strategy(strategy: str | TrainingStrategy) -> str | TrainingStrategy:
    """What to send Ray workers for a strategy: a built-in's name (they resolve it), else
    the strategy object (a user's, or what a name registered in this process stands for:
    the workers have not run the module that registered it)."""
    if isinstance(strategy, str) and strategy in BUILT_IN_TRAINING_STRATEGIES:
        return strategy
    return get_training_strategy(strategy)


__all__ = ["BASE_BATCH_DEFAULT", "BUILT_IN_TRAINING_STRATEGIES", "TRAINING_STRATEGIES",
           "BaseStrategy", "StrategySetup", "TrainingStrategy", "base_optimizer",
           "build_strategy", "get_training_strategy", "linear_scaled_lr",
           "portable_training_strategy", "register_training_strategy",
           "unregister_training_strategy", "warmup_scheduler"]
