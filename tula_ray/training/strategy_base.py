"""The training-strategy protocol and what every strategy shares (no Ray; core module).

`tula_ray.training.strategies` holds the registry and the built-in strategies; this
module is what a strategy builds on (the AGS strategy and a user's own import it).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Protocol, runtime_checkable

import torch
from torch import nn

from tula_ray.arguments import check_mapping
from tula_ray.precision import autocast_for, grad_scaler_for

# --------------------------------------------------------------------------- the protocol

@dataclass
class StrategySetup:
    """What a strategy builds: the optimizer, its scheduler, and the step hooks.

    optimizer: a `TulaOptimizer` for "ags"; a `PostLocalSGDOptimizer` for "polo"
        under torch.distributed with world size > 1; otherwise the plain optimizer.
    scheduler: stepped once per optimizer step, or None.
    notes: where this run departs from the paper's recipe, and why.
    comm_state: a DDP comm hook's state with an `iter` counter (PoLo's
        `PostLocalSGDState`); checkpoints carry the counter so a resumed run goes on alike.
    The hook methods below are plain training; a strategy overrides what it changes.
    """

    name: str
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    notes: list[str] = field(default_factory=list)
    comm_state: Any = None
    # The context a step's forward and loss run in (`tula_ray.precision`: torch.autocast
    # for bf16 and fp16); a strategy that overrides `backward` enters it there too.
    autocast: Callable[[], ContextManager] = contextlib.nullcontext
    # fp16's loss scaler (torch's GradScaler), or None: `backward` scales the loss, `step`
    # unscales, skips a step whose gradients overflowed, and moves the scale.
    scaler: torch.amp.GradScaler | None = None
    # Micro-batches per step (gradient accumulation): a local batch over the memory bound
    # is split, each part's backward adding to the gradients, one synchronisation.
    micro_batches: int = 1
    # How the LR follows a new global batch (the adaptive batch): called with (old B, new
    # B) before the first step at the new B; None: this strategy cannot change its B.
    rescale: Callable[[int, int], None] | None = None

    def set_precision(self, precision: str, device: torch.device | str) -> None:
        """Compute the steps in `precision` (`tula_ray.precision`): its autocast and, for
        fp16, a new loss scaler."""
        self.autocast = autocast_for(precision, device)
        self.scaler = grad_scaler_for(precision, device)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: scaled by the loss scaler, when there is one."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def start_epoch(self, epoch: int) -> None:
        """Called before the first step of every epoch."""

    def backward(self, model: nn.Module, loss_fn: Callable, inputs: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward (under `autocast`) and backward of one step (after zero_grad); returns
        (loss, outputs)."""
        with self.autocast():
            outputs = model(inputs)
            loss = loss_fn(outputs, targets)
        # Outside autocast, as torch advises: it follows the forward's types.
        self.scaled(loss).backward()
        return loss, outputs

    def step(self) -> None:
        """The optimizer step (through the loss scaler, which skips it when the gradients
        overflowed), then the scheduler's, every step alike (torch's AMP recipe: the
        schedule counts steps taken and skipped)."""
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()

    def train_step(self, model: nn.Module, loss_fn: Callable, inputs: torch.Tensor,
                   targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One training step under this strategy, the one every loop takes (an epoch, the
        strategy's measured cost while profiling, the AGS overhead benchmark): gradients
        zeroed, the strategy's backward, its step. Returns (loss, outputs, the LR the step
        applied, read before the scheduler moves it)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.micro_batches > 1:
            loss, outputs = self.accumulated_backward(model, loss_fn, inputs, targets)
        else:
            loss, outputs = self.backward(model, loss_fn, inputs, targets)
        lr = float(base_optimizer(self.optimizer).param_groups[0]["lr"])
        self.step()
        return loss, outputs, lr

    def accumulated_backward(self, model: nn.Module, loss_fn: Callable, inputs: torch.Tensor,
                             targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The strategy's backward over `micro_batches` parts of the batch, each loss
        weighted by its share of the samples so the gradients add up to the whole batch's
        mean; under DDP only the last part synchronises (`no_sync` before it). Returns the
        whole batch's (loss, outputs)."""
        losses, outputs = [], []
        parts = list(zip(inputs.tensor_split(self.micro_batches),
                         targets.tensor_split(self.micro_batches)))
        for index, (part_inputs, part_targets) in enumerate(parts):
            share = len(part_targets) / len(targets)
            last = index == len(parts) - 1
            quiet = contextlib.nullcontext() if last or not hasattr(model, "no_sync") \
                else model.no_sync()
            with quiet:
                loss, output = self.backward(
                    model, lambda out, tgt, w=share: loss_fn(out, tgt) * w,
                    part_inputs, part_targets)
            losses.append(loss.detach())
            outputs.append(output.detach())
        return torch.stack(losses).sum(), torch.cat(outputs)

    def set_global_batch(self, old: int, new: int, micro_batches: int = 1) -> None:
        """Train at global batch `new` (was `old`) from the next step, in `micro_batches`
        parts: the LR follows by the strategy's rule (`rescale`)."""
        if self.rescale is None:
            raise ValueError(f"training strategy {self.name!r} cannot change its global batch "
                             "while training (an adaptive batch): use ags-ns (the LR follows "
                             "AdaScale's gain), lrs or lars (the linear rule) or lbt")
        if new != old:
            self.rescale(old, new)
        self.micro_batches = int(micro_batches)

    def loss_scale(self) -> float:
        """The factor the gradients carry now: the loss scaler's scale (fp16), else 1.0.
        A gradient's squared norm is divided by its square."""
        return 1.0 if self.scaler is None else float(self.scaler.get_scale())

    def step_telemetry(self) -> dict[str, Any]:
        """What this strategy records about the step just taken (default: nothing)."""
        return {}

    def progress(self) -> tuple[float, int] | None:
        """AdaScale's progress for a strategy with a gain (`tula_ray.training.budget`):
        (the reference-batch steps made so far, that reference batch); None without one."""
        return None

    def epoch_metrics(self, telemetry: list[dict[str, Any]]) -> dict[str, Any]:
        """The epoch's extra metrics from its steps' telemetry (float values are averaged
        over the ranks by `train_epoch`; lists are per-step series); with a loss scaler,
        its scale at the epoch's end (a scale that keeps falling means overflowing
        steps, which were skipped)."""
        return {} if self.scaler is None else {"loss_scale": self.loss_scale()}


@runtime_checkable
class TrainingStrategy(Protocol):
    """A large-batch training strategy: its name, options, N/B checks and construction."""

    name: str
    options: tuple[str, ...]

    def check(self, num_workers: int, global_batch: int,
              options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """(options to run with, notes) for a run at N workers and global batch B, or
        ValueError naming what cannot work. Runs in the driver before any worker starts."""
        ...

    def build(self, model: nn.Module, *, global_batch: int, steps_per_epoch: int, epochs: int,
              lr: float, momentum: float, weight_decay: float,
              options: dict[str, Any], optimizer_fn: OptimizerFactory) -> StrategySetup:
        """The optimizer, scheduler and hooks for `model` (already on its device, DDP-wrapped
        under torch.distributed) trained at `global_batch`. optimizer_fn: the workload's
        optimizer at the run's base LR, which the strategy wraps or scales; lr, momentum
        and weight_decay are read from it (for a strategy that builds its own optimizer
        and says so in `base_optimizers`). A build without optimizer_fn (written before it
        existed) still works: it builds its own optimizer, and a note says so."""
        ...


# A search-space entry: ("loguniform", low, high), ("uniform", low, high) or ("choice", [..]).
# Plain data: the tuning entry point (tula_ray.tune_training) turns it into Ray Tune's.
TuningSpace = dict[str, tuple[Any, ...]]
LR_RANGE = (1e-3, 0.2)  # the base LR tuned for every strategy (paper §IV-B: 0.01 for all)


class BaseStrategy:
    """Shared behaviour of the built-in strategies: option-name check, no N/B rule, and
    a search space of the base LR alone."""

    name: str = ""
    options: tuple[str, ...] = ()
    # The optimizer classes the workload's optimizer_fn must build, for a strategy that
    # builds its own optimizer from its hyper-parameters (empty: it wraps any).
    base_optimizers: tuple[type[torch.optim.Optimizer], ...] = ()

    def search_space(self, global_batch: int) -> TuningSpace:
        """What `tula_ray.tune_training` tunes at `global_batch`: "lr" (the base LR, before
        the strategy's own scaling) and option names of this strategy."""
        return {"lr": ("loguniform", *LR_RANGE)}

    def check(self, num_workers: int, global_batch: int,
              options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return check_option_names(self, options), []

    def build(self, model: nn.Module, **kwargs: Any) -> StrategySetup:
        raise NotImplementedError

    def one_process_options(self, num_workers: int, global_batch: int,
                            options: dict[str, Any]) -> dict[str, Any]:
        """The options to build this strategy with in one process, on a stand-in model, for
        a job of `num_workers` at `global_batch`: the driver builds it once so that a bad
        option value fails there, not in every worker. Default: the options as they are."""
        return dict(options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# --------------------------------------------------------------------------- helpers

def check_option_names(strategy: TrainingStrategy, options: dict[str, Any] | None
                       ) -> dict[str, Any]:
    """A copy of `options`, refused if it is not a dict or names an option `strategy` lacks."""
    options = check_mapping("options", options, hint=f"the options of strategy {strategy.name!r}")
    unknown = sorted(set(options) - set(strategy.options))
    if unknown:
        raise ValueError(f"option {unknown[0]!r} is unknown for strategy {strategy.name!r}; "
                         f"allowed: {list(strategy.options) or 'none'}")
    return options


# params -> a torch optimizer: a Workload's optimizer_fn.
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def keep_lr(old: int, new: int) -> None:
    """A strategy whose LR does not depend on B (lbt): a new global batch changes nothing."""


def linear_rescale(optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler | None
                   ) -> Callable[[int, int], None]:
    """The linear scaling rule's answer to a new global batch (lrs, lars): every group's
    LR, and the scheduler's base LRs it ramps toward, times new B / old B."""
    def rescale(old: int, new: int) -> None:
        scale_lr(optimizer, new / old)
        for group in optimizer.param_groups:
            if "initial_lr" in group:
                group["initial_lr"] *= new / old
        if scheduler is not None:
            scheduler.base_lrs = [lr * new / old for lr in scheduler.base_lrs]
    return rescale


def scale_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Multiply every param group's LR (and the optimizer's default) by `factor`, so a
    user's per-group LRs keep their ratios."""
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
    if "lr" in optimizer.defaults:
        optimizer.defaults["lr"] = optimizer.defaults["lr"] * factor


def optimizer_at_lr(optimizer_fn: OptimizerFactory, lr: float | None) -> OptimizerFactory:
    """The factory `optimizer_fn` with its LR moved to `lr` (a tuned or given base LR),
    each param group scaled alike; None: the factory as it is."""
    if lr is None:
        return optimizer_fn

    def at_lr(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        optimizer = optimizer_fn(params)
        own = optimizer.defaults.get("lr")
        if not own:
            raise ValueError(f"lr={lr} cannot be applied: the workload's optimizer "
                             f"{type(optimizer).__name__} has no lr default to scale")
        scale_lr(optimizer, lr / float(own))
        return optimizer

    return at_lr


def probe_optimizer(optimizer_fn: OptimizerFactory) -> torch.optim.Optimizer:
    """What `optimizer_fn` builds, on one dummy parameter (no model is built): its class
    and `defaults` say what the workload trains with."""
    return optimizer_fn([nn.Parameter(torch.zeros(1))])


def check_base_optimizer(strategy: TrainingStrategy, optimizer_fn: OptimizerFactory,
                         workload_name: str = "") -> None:
    """Refuse a workload optimizer that `strategy` cannot train with (its
    `base_optimizers`), naming both, before any worker starts."""
    needed = tuple(getattr(strategy, "base_optimizers", ()))
    if not needed:
        return
    built = type(probe_optimizer(optimizer_fn))
    if not issubclass(built, needed):
        of = f"workload {workload_name!r}'s" if workload_name else "the workload's"
        names = " or ".join(f"torch.optim.{c.__name__}" for c in needed)
        raise ValueError(f"training strategy {strategy.name!r} builds its own optimizer from "
                         f"{names}'s hyper-parameters, but {of} optimizer_fn builds "
                         f"{built.__name__}: train it with 'ags-ns', 'ags', 'lrs', 'lbt' or "
                         f"'polo', which use any torch optimizer, or give the workload a "
                         f"{names} optimizer_fn")


def takes_optimizer_fn(strategy: TrainingStrategy) -> bool:
    """Whether the strategy's build accepts `optimizer_fn` (one written before the protocol
    had it does not: it builds its own optimizer)."""
    parameters = inspect.signature(strategy.build).parameters.values()
    return any(p.name == "optimizer_fn" or p.kind is p.VAR_KEYWORD for p in parameters)


def describe_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """E.g. "TulaOptimizer(Adam)" for a wrapper, "SGD" for a plain optimizer."""
    inner = base_optimizer(optimizer)
    if inner is optimizer:
        return type(optimizer).__name__
    return f"{type(optimizer).__name__}({type(inner).__name__})"


def base_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside a TulaOptimizer or PostLocalSGDOptimizer (else itself)."""
    for attr in ("base", "optim"):  # TulaOptimizer.base, PostLocalSGDOptimizer.optim
        inner = getattr(optimizer, attr, None)
        if isinstance(inner, torch.optim.Optimizer):
            return inner
    return optimizer
