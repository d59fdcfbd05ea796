"""Adaptive Gradient Scaling (paper §III-C, eq. 5-8, Algorithm 1): `TulaOptimizer`.

AGS watches the relative change of the squared gradient norm between steps
(eq. 5). In a calm phase (variability < delta) it multiplies every parameter's
large-batch gradient by a scale that makes it look like a small-batch gradient
(eq. 8, Algorithm 1 lines 5-6); in a sensitive phase it applies the gradient as
it is. The scales are refreshed from time to time (once per epoch by default,
§IV-A) by comparing a small-batch gradient with the large-batch one (line 16).

Data parallelism (DESIGN "AGS"): the optimizer only ever sees the gradient it is
about to apply. Under DDP that is the all-reduced gradient, so every replica
computes the same variability and takes the same decision. The small-batch
gradient comes from one of two `SOURCES`:
  "sub-batch": an extra forward/backward on the first `small_batch` samples of
      the local batch, outside DDP's all-reduce (the paper's line 13-14);
  "local": under DDP, each worker's own gradient before the all-reduce (a batch
      of B/N), which costs no extra backward: the refresh step all-reduces the
      gradients itself.
Workers then average their scales, so the replicas stay identical.

Algorithm 1 as printed, and where this implementation departs from it (each
departure is also commented where it is made; tests/test_ags.py holds the optimizer
step for step against a plain re-implementation of Algorithm 1):
  - line 10: scales computed at a refresh act from the NEXT step (`step()` installs
    them after the base optimizer's update), as in the paper;
  - lines 13-14: the extra forward/backward on the sub-batch runs in training mode
    and leaves every buffer (BatchNorm running statistics) as it found it;
  - refresh frequency: Algorithm 1 refreshes every iteration, §IV-A once per epoch
    "by default, although this frequency is configurable": `refresh_every`, default
    "epoch" (the first step of each epoch refreshes);
  - the first step has no previous norm (eq. 5 is undefined): it counts as sensitive;
  - the scales start at 1 (Algorithm 1's input); the first refresh is at the first step;
  - line 16 per element is computed literally, |g_small / (g_large + eps)|; 0/0 (a
    gradient of exactly -eps) counts as 0. Per tensor ("tensor" granularity, one
    reading of "per-parameter") it is |g_small| / (|g_large| + eps) with norms;
  - line 13's sub-batch is the first `small_batch` samples of the (shuffled) local batch;
  - line 9 is the wrapped optimizer's step (SGD with momentum in the paper's
    experiments), which adds weight decay itself: weight decay is not scaled;
  - under data parallelism each worker computes scales from its own sub-batch and
    the scales are averaged over the workers, so every replica applies the same ones.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

DELTA_DEFAULT = 0.5  # paper §IV-B / §VI: the variability threshold used in all experiments
EPS_DEFAULT = 1e-8  # Algorithm 1's numerical-stability term
SMALL_BATCH_DEFAULT = 32  # the reference small batch: NOTES-ENV's best-generalising B here
GRANULARITIES = ("tensor", "element")
SOURCES = ("sub-batch", "local")
REFRESH_EPOCH = "epoch"


# --------------------------------------------------------------------------- the equations

def gradient_variability(norm_sq: float, previous_norm_sq: float | None) -> float:
    """Eq. 5: |(|G_i|^2 - |G_{i-1}|^2) / |G_{i-1}|^2|, the relative change of the squared norm.

    Without a previous step (or after a zero gradient) the change is unbounded:
    the step counts as sensitive.
    """
    if previous_norm_sq is None or previous_norm_sq == 0.0:
        return math.inf
    return abs((norm_sq - previous_norm_sq) / previous_norm_sq)


def max_scale(large_batch: int, small_batch: int) -> float:
    """Algorithm 1 line 12: s_max = sqrt(B_large / B_small)."""
    return math.sqrt(large_batch / small_batch)


def scale_factor(g_small: torch.Tensor, g_large: torch.Tensor, *, s_max: float,
                 s_min: float = 0.0, eps: float = EPS_DEFAULT,
                 granularity: str = "tensor") -> torch.Tensor:
    """Algorithm 1 line 16: s = min(|g_small / (g_large + eps)|, s_max), bounded below by s_min.

    granularity "element": one scale per element, the shape of the parameter.
    "tensor": one scale for the whole tensor (a 0-dim tensor), the ratio of the norms.
    """
    if granularity == "element":
        # Literally |g_small / (g_large + eps)|; 0/0 (g_large == -eps exactly) counts as 0.
        ratio = torch.nan_to_num((g_small / (g_large + eps)).abs(), nan=0.0)
    elif granularity == "tensor":
        ratio = torch.linalg.vector_norm(g_small) / (torch.linalg.vector_norm(g_large) + eps)
    else:
        raise ValueError(f"granularity={granularity!r} is unknown; use one of {GRANULARITIES}")
    return ratio.clamp(min=s_min, max=s_max)


# --------------------------------------------------------------------------- the optimizer

def _world(process_group: Any) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group)


def _average_over_ranks(tensors: list[torch.Tensor], process_group: Any) -> None:
    """In place: the mean of each tensor over the ranks (one all-reduce per tensor).

    SUM then divide, since ReduceOp.AVG exists for NCCL only. Every rank receives the
    same bits, which is what keeps the replicas identical.
    """
    world = _world(process_group)
    if world == 1:
        return
    for tensor in tensors:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=process_group)
        tensor.div_(world)


GROUP_HYPERPARAMETERS = ("delta", "s_max", "s_min", "eps")  # in every param group
STATE_DICT_KEYS = {"state", "param_groups", "base_state", "ags"}


class TulaOptimizer(torch.optim.Optimizer):
    """Wraps any torch optimizer with Adaptive Gradient Scaling (Algorithm 1).

    A torch optimizer in its own right: `Optimizer.__init__` runs, so step pre/post
    hooks, LR schedulers and `state_dict` work as on any optimizer. The param groups
    are the base optimizer's own dicts (one list, shared), holding the base's
    hyper-parameters (lr, momentum, ...) and AGS's (`GROUP_HYPERPARAMETERS`: delta,
    s_max, s_min, eps), so a scheduler that sets `lr` or `delta` on this optimizer
    sets it for both. Per-parameter scales live in `self.state[p]["scale"]`; the base
    optimizer keeps its own state (momentum buffers) in `self.base.state`.
    `state_dict()` holds both (checkpoints of the format before this one, with keys
    "base" and "ags" only, are refused with a clear error: they cannot be loaded).

    Args:
        base_optimizer: the optimizer that applies the (scaled) gradient.
        large_batch: B, the number of samples the applied gradient averages over
            (the global batch under data parallelism).
        small_batch: the reference small batch b_small (source "local": B/N).
        delta: variability threshold of eq. 8: scale only when eq. 5 < delta.
        refresh_every: "epoch" (refresh at the first step after `start_epoch()`)
            or a number of steps.
        granularity: "tensor" (one scale per parameter tensor) or "element".
        s_max: upper bound of a scale; default sqrt(large_batch / small_batch).
        s_min: lower bound of a scale; 0 is the paper's literal algorithm, Lemma 1
            assumes a positive one.
        eps: the stability term of line 16.
        source: where the small-batch gradient comes from, one of `SOURCES`.
        process_group: the group scales are averaged over (default: the world).
    """

    def __init__(self, base_optimizer: torch.optim.Optimizer, *, large_batch: int,
                 small_batch: int = SMALL_BATCH_DEFAULT, delta: float = DELTA_DEFAULT,
                 refresh_every: str | int = REFRESH_EPOCH, granularity: str = "tensor",
                 s_max: float | None = None, s_min: float = 0.0, eps: float = EPS_DEFAULT,
                 source: str = "sub-batch", process_group: Any = None) -> None:
        _validate(base_optimizer, large_batch, small_batch, delta, refresh_every, granularity,
                  s_max, s_min, eps, source)
        self.base = base_optimizer  # before Optimizer.__init__: add_param_group reads it
        self.large_batch, self.small_batch = int(large_batch), int(small_batch)
        self.refresh_every, self.granularity, self.source = refresh_every, granularity, source
        self.process_group = process_group
        defaults = {"delta": delta, "s_max": max_scale(large_batch, small_batch)
                    if s_max is None else float(s_max), "s_min": float(s_min), "eps": eps}
        super().__init__(base_optimizer.param_groups, defaults)
        self.param_groups = base_optimizer.param_groups  # one list: new groups reach both
        self.defaults = {**base_optimizer.defaults, **defaults}
        self._previous_norm_sq: float | None = None
        self._counters = {"steps": 0, "scaled_steps": 0, "refreshes": 0, "steps_since_refresh": 0}
        self._epoch_pending = False
        self._scale_stats = {"scale_mean": 1.0, "scale_min": 1.0, "scale_max": 1.0}
        self.telemetry: dict[str, Any] = {"variability": math.nan, "scaled": False,
                                          **self._scale_stats, **self._counters}

    def __repr__(self) -> str:
        return (f"TulaOptimizer(large_batch={self.large_batch}, small_batch={self.small_batch}, "
                f"granularity={self.granularity!r}, source={self.source!r}, "
                f"refresh_every={self.refresh_every!r}, groups={[_ags_view(g) for g in self.param_groups]}, "
                f"base={self.base!r})")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the base optimizer and to AGS (AGS hyper-parameters default)."""
        if not any(param_group is group for group in self.base.param_groups):
            self.base.add_param_group(param_group)  # a user's new group: the base owns it
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        _validate_group(param_group)
        if not any(param_group is group for group in self.param_groups):
            self.param_groups.append(param_group)  # only while Optimizer.__init__ runs

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter of every group, in state_dict order."""
        return [p for group in self.param_groups for p in group["params"]]

    @property
    def scales(self) -> dict[nn.Parameter, torch.Tensor]:
        """The scales in effect, by parameter (absent: 1, Algorithm 1's input)."""
        return {p: state["scale"] for p, state in self.state.items() if "scale" in state}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

    # ------------------------------------------------------------------ scale refresh

    def start_epoch(self) -> None:
        """Mark an epoch boundary: with refresh_every="epoch" the next step refreshes."""
        self._epoch_pending = True

    @property
    def refresh_due(self) -> bool:
        """Whether the coming step should compute a small-batch gradient and refresh."""
        if self._counters["refreshes"] == 0:
            return True
        if self.refresh_every == REFRESH_EPOCH:
            return self._epoch_pending
        return self._counters["steps_since_refresh"] >= int(self.refresh_every)

    @torch.no_grad()
    def refresh_scales(self, small_grads: Sequence[torch.Tensor | None]) -> None:
        """UPDATEGRADSCALE (Algorithm 1 lines 11-18) against the gradients now in `p.grad`.

        small_grads: the small-batch gradient of each parameter, in `parameters()`
        order (None where a parameter has none). `p.grad` must hold the large-batch
        gradient that this step will apply. Under torch.distributed the scales are
        averaged over the ranks, so every replica applies the same ones. They act from
        the next step on (line 10): `step()` installs them after its update.
        """
        params = self.parameters()
        if len(small_grads) != len(params):
            raise ValueError(f"got {len(small_grads)} small-batch gradients for "
                             f"{len(params)} parameters; pass one per parameter (None if absent)")
        small = dict(zip(params, small_grads))
        scales = {}
        for group in self.param_groups:
            for p in group["params"]:
                if small[p] is not None and p.grad is not None:
                    scales[p] = scale_factor(small[p], p.grad, s_max=group["s_max"],
                                             s_min=group["s_min"], eps=group["eps"],
                                             granularity=self.granularity)
        _average_over_ranks(list(scales.values()), self.process_group)
        for p, scale in scales.items():
            self.state[p]["next_scale"] = scale
        flat = torch.cat([s.reshape(-1).float() for s in scales.values()]) if scales \
            else torch.ones(1)
        self._scale_stats = {"scale_mean": flat.mean().item(), "scale_min": flat.min().item(),
                             "scale_max": flat.max().item()}
        self._counters["refreshes"] += 1
        self._counters["steps_since_refresh"] = 0
        self._epoch_pending = False

    # ------------------------------------------------------------------ the step

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Algorithm 1 lines 3-10: eq. 5 on the gradient to apply, scale if calm, base step,
        then the scales of a refresh made during this step take effect.

        A closure is evaluated once, before the scaling; the base optimizer then
        steps without it (re-evaluating would overwrite the scaled gradient).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            # One host sync per step on GPU: the decision is a Python branch.
            norm_sq = torch.nn.utils.get_total_norm(grads).item() ** 2 if grads else 0.0
            variability = gradient_variability(norm_sq, self._previous_norm_sq)
            scaled = False
            for group in self.param_groups:  # eq. 8 with each group's delta
                if not variability < group["delta"]:
                    continue
                scaled = True
                for p in group["params"]:
                    scale = self.state[p].get("scale") if p in self.state else None
                    if scale is not None and p.grad is not None:
                        p.grad.mul_(scale)
            self._previous_norm_sq = norm_sq  # eq. 5 compares unscaled large-batch norms
        self.base.step()
        for state in self.state.values():  # line 10, after the weight update of line 9
            if "next_scale" in state:
                state["scale"] = state.pop("next_scale")
        self._counters["steps"] += 1
        self._counters["scaled_steps"] += int(scaled)
        self._counters["steps_since_refresh"] += 1
        self.telemetry = {"variability": variability, "scaled": scaled,
                          **self._scale_stats, **self._counters}
        return loss

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """torch's state_dict (AGS per-parameter state, the shared param groups) plus the
        base optimizer's per-parameter state ("base_state") and AGS's counters ("ags")."""
        state = super().state_dict()
        state["base_state"] = self.base.state_dict()["state"]
        state["ags"] = {"previous_norm_sq": self._previous_norm_sq,
                        "epoch_pending": self._epoch_pending,
                        "counters": dict(self._counters), "scale_stats": dict(self._scale_stats)}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        if not isinstance(state_dict, dict) or set(state_dict) != STATE_DICT_KEYS:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"not a TulaOptimizer state_dict: expected keys "
                             f"{sorted(STATE_DICT_KEYS)}, got {got} (a checkpoint of the format "
                             "before tula-ray 0.2, keys 'base' and 'ags', cannot be loaded)")
        own = {"state": state_dict["state"], "param_groups": state_dict["param_groups"]}
        self.base.load_state_dict({"state": state_dict["base_state"],
                                   "param_groups": state_dict["param_groups"]})
        super().load_state_dict(own)
        # Both loads made new group dicts: share the base's again (one list, one set of dicts).
        self.param_groups = self.base.param_groups
        ags = state_dict["ags"]
        self._previous_norm_sq = ags["previous_norm_sq"]
        self._epoch_pending = ags["epoch_pending"]
        self._counters = dict(ags["counters"])
        self._scale_stats = dict(ags["scale_stats"])


def _ags_view(group: dict[str, Any]) -> dict[str, Any]:
    return {name: group[name] for name in GROUP_HYPERPARAMETERS}


def _validate_group(group: dict[str, Any]) -> None:
    """A param group's AGS hyper-parameters (they may be set per group, or by a scheduler)."""
    delta, s_max, s_min, eps = (group[name] for name in GROUP_HYPERPARAMETERS)
    if not delta >= 0:
        raise ValueError(f"delta={delta!r}: the variability threshold must be >= 0 "
                         f"(paper default {DELTA_DEFAULT})")
    if not s_max > 0:
        raise ValueError(f"s_max={s_max!r}: must be > 0 (default sqrt(large/small batch))")
    if not 0 <= s_min <= s_max:
        raise ValueError(f"s_min={s_min!r}: need 0 <= s_min <= s_max ({s_max:.4g})")
    if not eps > 0:
        raise ValueError(f"eps={eps!r}: the stability term must be > 0")


def _validate(base_optimizer: Any, large_batch: int, small_batch: int, delta: float,
              refresh_every: Any, granularity: str, s_max: float | None, s_min: float,
              eps: float, source: str) -> None:
    if not isinstance(base_optimizer, torch.optim.Optimizer):
        raise TypeError(f"base_optimizer must be a torch.optim.Optimizer, "
                        f"not {type(base_optimizer).__name__}")
    if isinstance(base_optimizer, TulaOptimizer):
        raise TypeError("base_optimizer is already a TulaOptimizer; wrap the plain optimizer once")
    if not (isinstance(small_batch, int) and isinstance(large_batch, int)
            and 0 < small_batch < large_batch):
        raise ValueError(f"small_batch={small_batch!r}, large_batch={large_batch!r}: need integers "
                         "with 0 < small_batch < large_batch")
    if not delta >= 0:
        raise ValueError(f"delta={delta!r}: the variability threshold must be >= 0 "
                         f"(paper default {DELTA_DEFAULT})")
    if refresh_every != REFRESH_EPOCH and not (isinstance(refresh_every, int)
                                               and refresh_every >= 1):
        raise ValueError(f"refresh_every={refresh_every!r}: use {REFRESH_EPOCH!r} or a number "
                         "of steps >= 1")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is unknown; use one of {GRANULARITIES}")
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is unknown; use one of {SOURCES}")
    if s_max is not None and not s_max > 0:
        raise ValueError(f"s_max={s_max!r}: must be > 0 (default sqrt(large/small batch))")
    upper = max_scale(large_batch, small_batch) if s_max is None else s_max
    if not 0 <= s_min <= upper:
        raise ValueError(f"s_min={s_min!r}: need 0 <= s_min <= s_max ({upper:.4g})")
    if not eps > 0:
        raise ValueError(f"eps={eps!r}: the stability term must be > 0")


# --------------------------------------------------------------------------- the training step

def _is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


def _take_grads(params: list[nn.Parameter]) -> list[torch.Tensor | None]:
    """Detach the current gradients from the parameters (and leave p.grad empty)."""
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads


def backward_with_refresh(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                          inputs: torch.Tensor, targets: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of one step, refreshing the AGS scales when one is due.

    Replaces `loss_fn(model(inputs), targets).backward()` after `zero_grad()`;
    returns (loss, outputs) of the full local batch. Any other optimizer, or a
    step without a refresh, is exactly that plain backward.
    """
    refresh = isinstance(optimizer, TulaOptimizer) and optimizer.refresh_due
    if not refresh:
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        return loss, outputs
    params = optimizer.parameters()
    if optimizer.source == "local":
        return _local_source_step(model, optimizer, loss_fn, inputs, targets, params)
    if optimizer.small_batch >= len(inputs):
        raise ValueError(f"small_batch={optimizer.small_batch} must be smaller than the local "
                         f"batch ({len(inputs)} samples) to sample a sub-batch from it")
    # Lines 13-14: a sub-batch of the (shuffled) local batch, kept out of DDP's all-reduce,
    # in training mode (eval-mode BatchNorm would change the gradient) but with every
    # buffer (BatchNorm running statistics) restored afterwards: Algorithm 1 computes a
    # gradient here, it does not train the statistics on an extra batch.
    buffers = [b.detach().clone() for b in model.buffers()]
    with model.no_sync() if _is_ddp(model) else contextlib.nullcontext():
        loss_fn(model(inputs[: optimizer.small_batch]),
                targets[: optimizer.small_batch]).backward()
    with torch.no_grad():
        for buffer, saved in zip(model.buffers(), buffers):
            buffer.copy_(saved)
    small = _take_grads(params)
    outputs = model(inputs)
    loss = loss_fn(outputs, targets)
    loss.backward()
    optimizer.refresh_scales(small)
    return loss, outputs


def _local_source_step(model: nn.Module, optimizer: TulaOptimizer, loss_fn: Callable,
                       inputs: torch.Tensor, targets: torch.Tensor, params: list[nn.Parameter]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Source "local": this worker's gradient before the all-reduce is g_small (b = B/N)."""
    if not _is_ddp(model) or _world(optimizer.process_group) < 2:
        raise ValueError("source='local' takes g_small from each DDP worker's own gradient: it "
                         "needs a DistributedDataParallel model on >= 2 workers; "
                         "use source='sub-batch' here")
    with model.no_sync():
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
    small = [None if p.grad is None else p.grad.clone() for p in params]
    # This step's all-reduce, done here since no_sync() skipped DDP's.
    _average_over_ranks([p.grad for p in params if p.grad is not None],
                        optimizer.process_group)
    optimizer.refresh_scales(small)
    return loss, outputs

