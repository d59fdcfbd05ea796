"""Large-batch training strategies: AGS and the paper's four baselines (§IV-D).

`build_strategy` turns a strategy name into an optimizer and an LR scheduler
for a model that trains at a global batch B:

  "ags"   the workload's SGD wrapped in `TulaOptimizer` (Algorithm 1);
  "lbt"   vanilla large-batch training: the same SGD at B, LR unchanged;
  "lrs"   linear LR scaling lr * B / 128 with a linear warm-up (Goyal et al., [7]);
  "lars"  `pytorch_optimizer.LARS` with the same scaled LR and warm-up;
  "polo"  post-local SGD (Lin et al., [33]): torch's `PostLocalSGDOptimizer`,
          `PeriodicModelAverager` and DDP's `post_localSGD_hook`, with the warm-up.

Baselines are maintained library code (DESIGN "AGS"), not copies. Every
scheduler is a torch LR scheduler stepped once per optimizer step. Where the
run cannot follow the paper's recipe (fewer epochs than the warm-up, PoLo on
one worker, ...) the setup says so in `notes` and in the log; nothing is
dropped silently. No Ray here (core module).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tula_ray.workloads import LR_DEFAULT, MOMENTUM_DEFAULT, WEIGHT_DECAY_DEFAULT, sgd

logger = logging.getLogger(__name__)

STRATEGIES = ("ags", "lbt", "lrs", "lars", "polo")
BASE_BATCH_DEFAULT = 128  # paper §IV-D: LRS and LARS scale the LR linearly from a base batch 128
WARMUP_EPOCHS_DEFAULT = 5  # paper §IV-D: LRS, LARS and PoLo warm the LR up for 5 epochs
POLO_SWITCH_EPOCH = 5  # paper §IV-D: PoLo goes local after 5 epochs ...
POLO_AVERAGES_PER_EPOCH = 4  # ... and averages the models 4 times per epoch
# LARS trust coefficient eta; the paper (§IV-D) gives none. pytorch_optimizer's default
# 1e-3 (You et al., 2017) goes with LRs ~10: at this LR (0.01 x B/128) a step moves a
# layer by lr * eta * |w|, and a smoke run's loss barely moved (2.3041 -> 2.3037 while
# LBT's fell). 0.02 is NVIDIA apex LARC's default.
LARS_TRUST_COEFFICIENT_DEFAULT = 0.02

AGS_OPTIONS = ("delta", "small_batch", "refresh_every", "granularity", "s_max", "s_min", "source")
OPTIONS: dict[str, tuple[str, ...]] = {  # strategy -> the options it accepts
    "ags": AGS_OPTIONS,
    "lbt": (),
    "lrs": ("base_batch", "warmup_epochs"),
    "lars": ("base_batch", "warmup_epochs", "trust_coefficient"),
    # base_batch sets where PoLo's warm-up starts (see `warmup_scheduler`); PoLo does not scale.
    "polo": ("switch_epoch", "averages_per_epoch", "warmup_epochs", "base_batch"),
}


@dataclass
class StrategySetup:
    """What `build_strategy` returns: the optimizer to step and the scheduler to step after it.

    optimizer: a `TulaOptimizer` for "ags"; a `PostLocalSGDOptimizer` for "polo"
        under torch.distributed with world size > 1; otherwise the plain optimizer.
    scheduler: stepped once per optimizer step, or None (ags, lbt).
    notes: where this run departs from the paper's recipe, and why.
    comm_state: PoLo's DDP hook state (`PostLocalSGDState`) when one is registered;
        checkpoints carry its step counter so a resumed run stays local.
    """

    name: str
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    notes: list[str] = field(default_factory=list)
    comm_state: Any = None


def world_size() -> int:
    """The torch.distributed world size, 1 when it is not initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


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


def build_strategy(name: str, model: nn.Module, *, global_batch: int, steps_per_epoch: int,
                   epochs: int, lr: float = LR_DEFAULT, momentum: float = MOMENTUM_DEFAULT,
                   weight_decay: float = WEIGHT_DECAY_DEFAULT,
                   options: dict[str, Any] | None = None) -> StrategySetup:
    """The optimizer and LR scheduler of strategy `name` for `model` trained at `global_batch`.

    Args:
        name: one of `STRATEGIES`.
        model: the model to train, already on its device; may be DDP-wrapped ("polo"
            under torch.distributed needs DDP: it registers the post-local-SGD hook).
        global_batch: B, samples per optimizer step summed over all workers.
        steps_per_epoch: optimizer steps per epoch (dataset size // B with drop_last).
        epochs: epochs the run will train (the warm-up is clamped to it).
        lr, momentum, weight_decay: the workload's SGD (paper §IV-B), before any scaling.
        options: strategy-specific overrides, see `OPTIONS` (ags: `TulaOptimizer`'s
            arguments; lrs/lars: base_batch, warmup_epochs; lars: trust_coefficient;
            polo: switch_epoch, averages_per_epoch, warmup_epochs, base_batch).
    Raises:
        ValueError: unknown strategy or option, or a value out of range.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy {name!r} is unknown; use one of {STRATEGIES}")
    options = _check_options(name, options)
    for label, value in (("global_batch", global_batch), ("steps_per_epoch", steps_per_epoch),
                         ("epochs", epochs)):
        _check_int(label, value, minimum=1)
    if not lr > 0:
        raise ValueError(f"lr={lr!r}: the learning rate must be > 0")
    notes: list[str] = []
    params = list(model.parameters())
    if name == "ags":
        optimizer: torch.optim.Optimizer = _ags(sgd(params, lr, momentum, weight_decay),
                                                global_batch, options)
        return _setup(name, optimizer, None, notes)
    if name == "lbt":
        return _setup(name, sgd(params, lr, momentum, weight_decay), None, notes)

    base_batch = options.get("base_batch", BASE_BATCH_DEFAULT)
    _check_int("base_batch", base_batch, minimum=1)
    warmup_epochs = options.get("warmup_epochs", WARMUP_EPOCHS_DEFAULT)
    _check_int("warmup_epochs", warmup_epochs, minimum=0)
    if warmup_epochs > epochs:
        notes.append(f"warm-up clamped from {warmup_epochs} to {epochs} epochs: the run has "
                     f"only {epochs} (paper §IV-D warms up for {WARMUP_EPOCHS_DEFAULT})")
        warmup_epochs = epochs
    warmup_steps = warmup_epochs * steps_per_epoch

    if name in ("lrs", "lars"):
        scaled = linear_scaled_lr(lr, global_batch, base_batch)
        if name == "lrs":
            optimizer = sgd(params, scaled, momentum, weight_decay)
        else:
            from pytorch_optimizer import LARS  # here: only this baseline pays for its import

            trust = options.get("trust_coefficient", LARS_TRUST_COEFFICIENT_DEFAULT)
            if not trust > 0:
                raise ValueError(f"trust_coefficient={trust!r}: must be > 0 "
                                 f"(default {LARS_TRUST_COEFFICIENT_DEFAULT})")
            optimizer = LARS(params, lr=scaled, momentum=momentum, weight_decay=weight_decay,
                             trust_coefficient=trust)
        scheduler = warmup_scheduler(optimizer, warmup_steps=warmup_steps,
                                     global_batch=global_batch, base_batch=base_batch)
        return _setup(name, optimizer, scheduler, notes)

    # polo: the warm-up schedules the inner SGD, whose step the PoLo wrapper calls.
    local = sgd(params, lr, momentum, weight_decay)
    scheduler = warmup_scheduler(local, warmup_steps=warmup_steps, global_batch=global_batch,
                                 base_batch=base_batch)
    optimizer, comm_state = _polo(model, local, steps_per_epoch, epochs, options, notes)
    return _setup(name, optimizer, scheduler, notes, comm_state)


def base_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside a TulaOptimizer or PostLocalSGDOptimizer (else itself)."""
    for attr in ("base", "optim"):  # TulaOptimizer.base, PostLocalSGDOptimizer.optim
        inner = getattr(optimizer, attr, None)
        if isinstance(inner, torch.optim.Optimizer):
            return inner
    return optimizer


# --------------------------------------------------------------------------- helpers

def _setup(name: str, optimizer: torch.optim.Optimizer, scheduler: Any, notes: list[str],
           comm_state: Any = None) -> StrategySetup:
    for note in notes:
        logger.warning("strategy %s: %s", name, note)
    return StrategySetup(name, optimizer, scheduler, notes, comm_state)


def _check_int(label: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{label}={value!r}: must be an integer >= {minimum}")


def _check_options(name: str, options: dict[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"options must be a dict of {name} options, not {type(options).__name__}")
    allowed = OPTIONS[name]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"option {unknown[0]!r} is unknown for strategy {name!r}; "
                         f"allowed: {list(allowed) or 'none'}")
    return dict(options)


def _ags(optimizer: torch.optim.Optimizer, global_batch: int,
         options: dict[str, Any]) -> torch.optim.Optimizer:
    """The SGD wrapped in TulaOptimizer; source "local" defaults small_batch to B / world size."""
    from tula_ray.ags import TulaOptimizer  # lazy: keeps this module importable on its own

    options = dict(options)
    if options.get("source") == "local":
        world = world_size()
        if world < 2:
            raise ValueError("ags option source='local' takes g_small from each DDP worker's own "
                             "gradient: it needs torch.distributed with >= 2 workers (world size "
                             "is 1); use source='sub-batch'")
        if global_batch % world:
            raise ValueError(f"global_batch={global_batch} is not divisible by the world size "
                             f"{world}: source='local' needs equal local batches")
        options.setdefault("small_batch", global_batch // world)
    return TulaOptimizer(optimizer, large_batch=global_batch, **options)


def _polo(model: nn.Module, local: torch.optim.Optimizer, steps_per_epoch: int, epochs: int,
          options: dict[str, Any], notes: list[str]) -> tuple[torch.optim.Optimizer, Any]:
    """PostLocalSGDOptimizer + PeriodicModelAverager + DDP's post-local-SGD hook (world > 1)."""
    switch_epoch = options.get("switch_epoch", POLO_SWITCH_EPOCH)
    _check_int("switch_epoch", switch_epoch, minimum=0)
    averages = options.get("averages_per_epoch", POLO_AVERAGES_PER_EPOCH)
    _check_int("averages_per_epoch", averages, minimum=1)
    if world_size() < 2:
        notes.append("polo at world size 1 is plain SGD with the warm-up: there are no "
                     "replicas to go local on or to average")
        return local, None
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValueError(f"polo under torch.distributed (world size {world_size()}) needs a "
                         f"DistributedDataParallel model to register its comm hook; got "
                         f"{type(model).__name__}: wrap it in DDP before build_strategy")
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
        PostLocalSGDState, post_localSGD_hook)
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
