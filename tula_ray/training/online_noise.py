"""The gradient noise scale measured while training (issue 43, item 2), for every training
strategy, with no extra all-reduce of the gradients and, under DDP, no extra backward.

Each step gives McCandlish et al.'s pair (`tula_ray.models.noise_scale.signal_and_noise`):
a gradient of b samples and one of B > b, of the same model at the same point:

  N >= 2 workers (DDP): each worker's own gradient (b = B / N) and the all-reduced one
      (B). `OnlineNoise.attach` registers one DDP comm hook (`noise_comm_hook`) around
      the strategy's own (DDP takes one per model; `captured_comm_hook` takes what the
      strategy's build registers): per bucket it adds the local bucket's squared norm,
      then runs the strategy's hook (or DDP's default all-reduce). The all-reduced
      gradient's squared norm is read from `p.grad` by an optimizer step pre-hook, after
      fp16's unscaling and before the optimizer (AGS) touches it. The workers' local
      norms are averaged at each read (`flush`), one all-reduce of a vector of the steps
      since the last read: no collective per step.
      - "ags"/"ags-ns" source "local" (`local_gradient_hook`): composed, both run;
      - "polo" (`post_localSGD_hook`): the pair exists until its switch to local SGD;
        after it the gradients are not all-reduced at all, so there is no B-sample
        gradient: those steps record no pair and the estimate reads NaN;
      - any other hook, or a built-in (C++) one, is registered as the strategy asked and
        not wrapped: its result need not be the workers' mean, so no pair is taken and
        the estimate reads NaN (`note` says why).
  N = 1: a sub-batch of the step's batch against the whole batch (b < B):
      - AGS(-NS) with source "sub-batch", refreshed every step: its sub-batch gradient
        (`TulaOptimizer.observed_small_sqr`), already computed: no extra backward;
      - every other strategy: the first half of the batch (b = B / 2), an extra forward
        and backward every `every_steps` steps (`before_step`; its cost is
        `HALF_BATCH_EVERY_STEPS_DEFAULT`'s, benchmarks/accuracy/online_noise.py).

The pairs are averaged by a `NoiseAverage` with a timescale in samples and bias
correction (AdaptDL's way); |G|^2 (`grad_sqr`), tr(Sigma) (`grad_var`) and phi =
tr(Sigma) / |G|^2 (`noise_scale`) come from the averages. Per step everything stays on
the device (no host sync, except fp16's loss scale under DDP); `read` (every rank at the
same point: an epoch's end, an evaluation) moves the steps' pairs to the host. No Ray
here (core module).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import post_localSGD_hook

from tula_ray.ags.optimizer import TulaOptimizer
from tula_ray.ags.sources import is_ddp, local_gradient_hook
from tula_ray.distributed import average_tensors_over_ranks, reduce_device, world_size
from tula_ray.models.noise_scale import NoiseAverage
from tula_ray.training.strategy_base import StrategySetup

# The averages' timescale: a pair S samples ago weighs exp(-S / T). 8192 samples hold
# ~2T/B = 64 pairs at B = 256, the precision of the >= 64-pair reference
# (`measure_noise_scale`) at the profile's pair batch, and ~0.8 epoch of the 10k-image
# subset; AGS-NS's own 0.9 per step (10 steps) is 1280 samples at B = 128: too short.
TIMESCALE_SAMPLES_DEFAULT = 8192
# One worker without a sub-batch: an extra backward on half the batch every 32 steps,
# ~0.5 / 32 = 1.6 % of the forward and backward (the bound: 3 %).
HALF_BATCH_EVERY_STEPS_DEFAULT = 32
NOISE_METRICS = ("noise_scale", "grad_sqr", "grad_var")  # what `read` reports
PENDING_CHUNK_STEPS = 1024  # steps' pairs kept between reads are stacked by this many


@dataclass
class CapturedHook:
    """The comm hook a strategy's build asked DDP for (`captured_comm_hook`)."""

    state: Any = None
    hook: Callable | None = None
    builtin: Any = None  # a dist.BuiltinCommHookType, registered as asked


@contextlib.contextmanager
def captured_comm_hook(model: nn.Module) -> Iterator[CapturedHook]:
    """Within: a comm hook registered on the DDP `model` is kept in the `CapturedHook`
    yielded, not registered (DDP takes one hook, once): `OnlineNoise.attach` registers it,
    wrapped, afterwards. Without DDP, nothing is captured."""
    captured = CapturedHook()
    if not is_ddp(model):
        yield captured
        return

    def register(state: Any, hook: Callable) -> None:
        captured.state, captured.hook = state, hook

    def register_builtin(comm_hook_type: Any) -> None:
        captured.builtin = comm_hook_type

    model.register_comm_hook = register  # this instance only, for the build
    model.register_builtin_comm_hook = register_builtin
    try:
        yield captured
    finally:
        del model.register_comm_hook, model.register_builtin_comm_hook


class NoiseHookState:
    """`noise_comm_hook`'s state: the estimator, and the strategy's hook it runs."""

    def __init__(self, noise: OnlineNoise, captured: CapturedHook, process_group: Any) -> None:
        self.noise, self.captured, self.process_group = noise, captured, process_group


def noise_comm_hook(state, bucket):  # no annotations: DDP checks them (see sources.py)
    """DDP comm hook: this worker's bucket's squared norm, then the strategy's hook (or
    DDP's default all-reduce)."""
    synced = not _goes_local(state.captured)
    state.noise.add_local(bucket.buffer(), bucket.is_last(), synced)
    if state.captured.hook is None:
        return allreduce_hook(state.process_group, bucket)
    return state.captured.hook(state.captured.state, bucket)


def _goes_local(captured: CapturedHook) -> bool:
    """Whether PoLo's hook will leave this step's gradients local (after its switch)."""
    polo = captured.state
    return (captured.hook is post_localSGD_hook and polo.iter >= polo.start_localSGD_iter
            and not polo.post_local_gradient_allreduce)


# Hooks whose future holds the workers' mean gradient (PoLo's: until its switch).
MEAN_HOOKS = (None, local_gradient_hook, post_localSGD_hook)


class OnlineNoise:
    """One run's online noise scale: `attach` it after the strategy's build, call
    `before_step` before each training step (one worker: the half-batch backward when
    due), and `read` on every rank at the same points.

    local_batch: samples per worker per step; timescale_samples: the averages' (see
    `TIMESCALE_SAMPLES_DEFAULT`); every_steps: the one-worker half-batch's interval."""

    def __init__(self, model: nn.Module, setup: StrategySetup, loss_fn: Callable,
                 local_batch: int, *, timescale_samples: float = TIMESCALE_SAMPLES_DEFAULT,
                 every_steps: int = HALF_BATCH_EVERY_STEPS_DEFAULT) -> None:
        self.model, self.setup, self.loss_fn = model, setup, loss_fn
        self.world = world_size(getattr(model, "process_group", None)) if is_ddp(model) else 1
        self.local_batch, self.every_steps = int(local_batch), int(every_steps)
        self.average = NoiseAverage(timescale_samples=timescale_samples)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device
        self.mode, self.note = "halves", ""
        self.steps = 0  # training steps seen (the half-batch's schedule)
        self._pending: list[torch.Tensor] = []  # per step [|g_b|^2, |g_B|^2], on the device
        self._batches: list[tuple[int, int]] = []  # per step (b, B)
        self._local = torch.zeros((), dtype=torch.float64, device=self.device)
        self._backward_done, self._new_backward, self._synced = False, True, True
        self._small: tuple[torch.Tensor, int] | None = None  # this step's b-sample |g_b|^2
        self._stale = False  # the last step had no pair where pairs were expected

    @classmethod
    def attach(cls, model: nn.Module, setup: StrategySetup, loss_fn: Callable,
               local_batch: int, captured: CapturedHook | None = None,
               **options: Any) -> OnlineNoise:
        """The estimator of a run, its hooks registered: under DDP the comm hook around
        `captured` (what the strategy asked for; registered as asked when it cannot be
        wrapped), and on every run the optimizer step pre-hook."""
        noise = cls(model, setup, loss_fn, local_batch, **options)
        captured = captured or CapturedHook()
        if noise.world > 1:
            noise._register_comm_hook(captured)
        elif _reuses_sub_batch(setup.optimizer):
            noise.mode = "sub-batch"
        _register_step_pre_hook(setup.optimizer, noise._record)
        return noise

    def _register_comm_hook(self, captured: CapturedHook) -> None:
        self.mode = "workers"
        if captured.builtin is not None:
            self.model.register_builtin_comm_hook(captured.builtin)
            self.mode, self.note = "none", (f"built-in comm hook {captured.builtin}: the "
                                            "local gradients are not seen; no noise scale")
        elif captured.hook not in MEAN_HOOKS:
            self.model.register_comm_hook(captured.state, captured.hook)
            name = getattr(captured.hook, "__qualname__", captured.hook)
            self.mode, self.note = "none", (f"comm hook {name} is not known to all-reduce "
                                            "the gradients (the pair's B): no noise scale")
        else:
            self.model.register_comm_hook(
                NoiseHookState(self, captured, self.model.process_group), noise_comm_hook)
            if captured.hook is post_localSGD_hook:
                self.note = ("polo: after its switch to local SGD the gradients are not "
                             "all-reduced, so there is no pair: noise_scale reads NaN")

    # ------------------------------------------------------------------ per step

    def add_local(self, buffer: torch.Tensor, last: bool, synced: bool) -> None:
        """A DDP bucket of this worker's gradient (the comm hook's), before it is reduced."""
        if self._new_backward:  # the first bucket of a backward
            self._local.zero_()
            self._new_backward = False
        flat = buffer.detach().reshape(-1).float()
        self._local += torch.dot(flat, flat).double()
        self._synced = synced
        # The last bucket: the sum is this step's (a skipped fp16 step's is never read).
        self._backward_done = self._new_backward = last

    @torch.no_grad()
    def before_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Before a training step on this worker's batch: on one worker without a
        sub-batch, at the first step and every `every_steps` steps after, |g_b|^2 of the batch's first half (its
        forward and backward in training mode, every buffer restored, the gradients
        cleared for the step's own backward)."""
        due = self.steps % self.every_steps == 0  # the first step, then every every_steps
        self.steps += 1
        half = len(inputs) // 2
        if self.mode != "halves" or not due or half < 1:
            return
        buffers = [b.detach().clone() for b in self.model.buffers()]
        self.model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            with self.setup.autocast():
                loss = self.loss_fn(self.model(inputs[:half]), targets[:half])
            self.setup.scaled(loss).backward()
        for buffer, saved in zip(self.model.buffers(), buffers):
            buffer.copy_(saved)
        self._small = (_squared_norm(self.params) / self.setup.loss_scale() ** 2, half)
        self.model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def _record(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: p.grad is the step's B-sample gradient (all-reduced,
        unscaled); the step's pair goes to the pending list, on the device."""
        small = self._small_sqr()
        if small is None:
            return
        value, small_batch = small
        self._pending.append(torch.stack([value, _squared_norm(self.params)]))
        self._batches.append((small_batch, self.local_batch * self.world))
        if len(self._pending) >= PENDING_CHUNK_STEPS:  # one tensor, not thousands
            self._pending = [torch.cat([p.reshape(-1, 2) for p in self._pending])]

    def _small_sqr(self) -> tuple[torch.Tensor, int] | None:
        """This step's |g_b|^2 (a NaN under PoLo's local SGD) and b, or None: no pair."""
        if self.mode == "workers":
            if not self._backward_done:
                return None
            self._backward_done = False
            if not self._synced:
                return torch.full((), math.nan, dtype=torch.float64, device=self.device), 0
            return self._local / self.setup.loss_scale() ** 2, self.local_batch
        if self.mode == "sub-batch":
            observed = self.setup.optimizer.observed_small_sqr()
            return None if observed is None else (observed, self.setup.optimizer.small_batch)
        small, self._small = self._small, None
        return small

    # ------------------------------------------------------------------ reading

    def flush(self) -> list[tuple[float, float, float, float]]:
        """The pairs taken since the last flush, as (|g_b|^2 averaged over the workers, b,
        |g_B|^2, B), added to the average in order. Every rank at the same point (one
        all-reduce under DDP, of the local norms of those steps)."""
        rows: list[tuple[float, float]] = []
        if self._pending:
            pending = torch.cat([p.reshape(-1, 2) for p in self._pending])
            local = pending[:, 0].contiguous()
            if self.mode == "workers":  # the workers' mean |g_b|^2, step by step
                local = local.to(reduce_device(self.device))
                average_tensors_over_ranks([local])
            rows = list(zip(local.tolist(), pending[:, 1].tolist()))
        pairs = [(small, b, large, big) for (small, large), (b, big) in zip(rows, self._batches)]
        for pair in pairs:
            self.average.update(*pair)
        if pairs:
            self._stale = not math.isfinite(pairs[-1][0])
        self._pending, self._batches = [], []
        return pairs

    def metrics(self) -> dict[str, float]:
        """noise_scale, grad_sqr, grad_var of the averages (NaN before a pair, and while no
        pair exists: PoLo's local SGD, a hook that cannot be read)."""
        if self.mode == "none" or self._stale:
            return dict.fromkeys(NOISE_METRICS, math.nan)
        grad_sqr, grad_var = self.average.estimate()
        return {"noise_scale": self.average.noise_scale, "grad_sqr": grad_sqr,
                "grad_var": grad_var}

    def read(self) -> dict[str, float]:
        """`flush`, then `metrics`: every rank at the same point."""
        self.flush()
        return self.metrics()

    def state_dict(self) -> dict[str, Any]:
        """The averages (read first: the pending steps are not in it) and the step count."""
        return {"average": self.average.state_dict(), "steps": self.steps, "stale": self._stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average.load_state_dict(state["average"])
        self.steps, self._stale = int(state["steps"]), bool(state["stale"])


def _squared_norm(params: list[nn.Parameter]) -> torch.Tensor:
    """The squared norm of every parameter's gradient together (0-d float64, no sync)."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=params[0].device)
    return torch.stack(torch._foreach_norm(grads)).double().square().sum()


def _reuses_sub_batch(optimizer: torch.optim.Optimizer) -> bool:
    """AGS with a sub-batch gradient at every step: the pair is there, no backward to add."""
    return (isinstance(optimizer, TulaOptimizer) and optimizer.source == "sub-batch"
            and optimizer.refresh_every == 1)


def _register_step_pre_hook(optimizer: torch.optim.Optimizer, hook: Callable) -> None:
    """`hook` before the gradient is used: on the outer optimizer (AGS scales p.grad in
    its own step), or on the inner one when the outer never ran `Optimizer.__init__`
    (torch's PostLocalSGDOptimizer, whose step calls its inner optimizer's)."""
    try:
        optimizer.register_step_pre_hook(hook)
    except AttributeError:
        optimizer.optim.register_step_pre_hook(hook)
