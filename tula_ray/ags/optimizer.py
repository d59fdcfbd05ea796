"""Adaptive Gradient Scaling (paper §III-C, Algorithm 1): `TulaOptimizer`, which applies
the equations of tula_ray.ags.equations (eq. 5-8).

AGS watches the relative change of the squared gradient norm between steps
(eq. 5). In a calm phase (variability < delta) it multiplies every parameter's
large-batch gradient by a scale that makes it look like a small-batch gradient
(eq. 8, Algorithm 1 lines 5-6); in a sensitive phase it applies the gradient as
it is. The scales are refreshed from time to time (once per epoch by default,
§IV-A) by comparing a small-batch gradient with the large-batch one (line 16):
the refresh and its estimators are `tula_ray.ags.refresh.ScaleRefresh`'s, a mixin
of the optimizer; the step, the state and the checkpoints are here.

Data parallelism (DESIGN "AGS"): the optimizer only ever sees the gradient it is
about to apply. Under DDP that is the all-reduced gradient, so every replica
computes the same variability and takes the same decision. The small-batch
gradient comes from one of two `SOURCES` (tula_ray.ags.sources):
  "sub-batch": an extra forward/backward on the first `small_batch` samples of
      the local batch, outside DDP's all-reduce (the paper's line 13-14);
  "local": under DDP, each worker's own gradient before the all-reduce (a batch
      of B/N), read by a DDP comm hook: no extra backward.
Workers then average their scales (or the statistics they come from), so the
replicas stay identical.

Beyond the paper, as options of the same optimizer (DESIGN "Beyond the paper"): per
tensor, s^2 = |g_b|^2 / |g_B|^2 estimates AdaScale's gain ratio r (McCandlish et
al.: E|g_b|^2 = |G|^2 + tr(Sigma)/b), and s_max^2 = B/b is AdaScale's ceiling. So:
  gain_exponent: s = r^p; p = 1/2 is the paper's s = |g_small| / |g_large|, p = 1 AdaScale's;
  estimator: "refresh" (the paper: the ratio of one refresh, frozen until the next)
      or "ema" (moving averages of |g_b|^2 and |g_B|^2 over the refreshes; with
      refresh_every=1 and the "local" source, every step at no extra backward);
  small_batch: the reference batch b_ref the scales emulate; when the measured batch
      b differs (source "local": b = B/N), r is carried to b_ref by `gain_ratio`;
  s_max (the cap, default (B/b_ref)^p), s_min, and delta=None (the gate off).
The defaults are the paper's literal algorithm.

Algorithm 1 as printed, and where this implementation departs from it (each
departure is also commented where it is made; tests/test_ags.py holds the optimizer
step for step against a plain re-implementation of Algorithm 1):
  - line 10: scales computed at a refresh act from the NEXT step (`step()` installs
    them after the base optimizer's update), as in the paper;
  - lines 11-18 run inside `step()`, from the small-batch gradients the backward
    observed (`observe_small_gradients`), against the gradient about to be applied: under
    fp16's loss scaling that one is unscaled by then, and a skipped step refreshes nothing;
  - lines 13-14: the extra forward/backward on the sub-batch runs in training mode
    and leaves every buffer (BatchNorm running statistics) as it found it;
  - refresh frequency: Algorithm 1 refreshes every iteration, §IV-A once per epoch
    "by default, although this frequency is configurable": `refresh_every`, default
    "epoch" (the first step of each epoch refreshes);
  - the first step has no previous norm (eq. 5 is undefined): it counts as sensitive;
  - a step at a B no larger than the reference small batch (`plain`: an adaptive batch
    at a small B) is the base optimizer's alone, as the strategies build at such a B;
    the next scaled step counts as a first one;
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

import math
from typing import Any, Callable

import torch
from torch import nn

from tula_ray.ags.equations import (DELTA_DEFAULT, EMA_DECAY_DEFAULT, EPS_DEFAULT,
                                    GAIN_EXPONENT_PAPER, REFRESH_EPOCH, SMALL_BATCH_DEFAULT,
                                    gradient_variability, max_scale)
from tula_ray.ags.options import GROUP_HYPERPARAMETERS, check_group, check_options
from tula_ray.ags.refresh import ScaleRefresh
from tula_ray.distributed import world_size

STATE_DICT_KEYS = {"state", "param_groups", "base_state", "ags"}


class TulaOptimizer(ScaleRefresh, torch.optim.Optimizer):
    """Wraps any torch optimizer with Adaptive Gradient Scaling (Algorithm 1).

    A torch optimizer in its own right: `Optimizer.__init__` runs, so step pre/post
    hooks, LR schedulers and `state_dict` work as on any optimizer. The param groups
    are the base optimizer's own dicts (one list, shared), holding the base's
    hyper-parameters (lr, momentum, ...) and AGS's (`GROUP_HYPERPARAMETERS`), so a
    scheduler that sets `lr` or `delta` on this optimizer sets it for both.
    Per-parameter AGS state lives in `self.state[p]` ("scale"; "small_sq_avg" and
    "large_sq_avg" for the "ema" estimator); the base optimizer keeps its own state
    (momentum buffers) in `self.base.state`. `state_dict()` holds both (checkpoints
    of the format before this one, keys "base" and "ags" only, are refused with a
    clear error: they cannot be loaded).

    Args:
        base_optimizer: the optimizer that applies the (scaled) gradient.
        large_batch: B, the number of samples the applied gradient averages over
            (the global batch under data parallelism).
        small_batch: the reference small batch b_small whose gradient the scales
            emulate (the paper's; source "local" measures at b = B/N, see `gain_ratio`).
        delta: variability threshold of eq. 8: scale only when eq. 5 < delta; None: always.
        refresh_every: "epoch" (refresh at the first step after `start_epoch()`)
            or a number of steps.
        granularity: "tensor" (one scale per parameter tensor) or "element".
        s_max: upper bound of a scale; default (large_batch / small_batch)^gain_exponent.
        s_min: lower bound of a scale; 0 is the paper's literal algorithm, Lemma 1
            assumes a positive one.
        eps: the stability term of line 16.
        source: where the small-batch gradient comes from, one of `SOURCES`.
        gain_exponent: p in s = r^p (1/2: the paper, 1: AdaScale).
        estimator: "refresh" (the paper) or "ema" (per tensor only), see the module doc.
        ema_decay: the moving averages' decay per refresh (estimator "ema").
        process_group: the group scales are averaged over (default: the world).
    """

    def __init__(self, base_optimizer: torch.optim.Optimizer, *, large_batch: int,
                 small_batch: int = SMALL_BATCH_DEFAULT, delta: float | None = DELTA_DEFAULT,
                 refresh_every: str | int = REFRESH_EPOCH, granularity: str = "tensor",
                 s_max: float | None = None, s_min: float = 0.0, eps: float = EPS_DEFAULT,
                 source: str = "sub-batch", gain_exponent: float = GAIN_EXPONENT_PAPER,
                 estimator: str = "refresh", ema_decay: float = EMA_DECAY_DEFAULT,
                 process_group: Any = None) -> None:
        if isinstance(base_optimizer, TulaOptimizer):
            raise TypeError("base_optimizer is already a TulaOptimizer; wrap the plain optimizer "
                            "once")
        check_options(base_optimizer, large_batch, small_batch, refresh_every, granularity, source,
                      estimator)
        self.base = base_optimizer  # before Optimizer.__init__: add_param_group reads it
        self.large_batch, self.small_batch = int(large_batch), int(small_batch)
        self.s_max_given = s_max is not None  # else it follows B (`resize`)
        self.refresh_every, self.granularity, self.source = refresh_every, granularity, source
        self.estimator, self.process_group = estimator, process_group
        self.local_hook_registered = False  # set by sources.register_local_gradient_hook
        defaults = {"delta": delta, "s_max": max_scale(large_batch, small_batch, gain_exponent)
                    if s_max is None else float(s_max), "s_min": float(s_min), "eps": eps,
                    "gain_exponent": float(gain_exponent), "ema_decay": float(ema_decay)}
        super().__init__(base_optimizer.param_groups, defaults)
        self.param_groups = base_optimizer.param_groups  # one list: new groups reach both
        self.defaults = {**base_optimizer.defaults, **defaults}
        # Small-batch gradients (or their norms) observed for this step's refresh: the
        # comm hook's (source "local") or the sub-batch backward's.
        self._local: dict[nn.Parameter, torch.Tensor] = {}
        # The factor the observed gradients carry: fp16's loss scale, set by the training
        # step before `step()` (whose gradients its GradScaler has divided back by then).
        self.loss_scale = 1.0
        self._previous_norm_sq: float | None = None
        self._counters = {"steps": 0, "scaled_steps": 0, "refreshes": 0, "steps_since_refresh": 0}
        self._epoch_pending = False
        self._scale_stats = {"scale_mean": 1.0, "scale_min": 1.0, "scale_max": 1.0}
        # AdaScale's progress (estimator "ema"): the sum of the whole model's gain over the
        # steps, in reference-batch steps; on the device, read once an epoch.
        self._gain: torch.Tensor | None = None
        self._progress: torch.Tensor | float = 0.0
        # The (measured, large) batches the "ema" averages hold norms of: after a change
        # of B they are carried to the new ones (`ScaleRefresh._carry_averages`).
        self._averages_at: tuple[int, int] | None = None
        self.telemetry: dict[str, Any] = {"variability": math.nan, "scaled": False,
                                          **self._scale_stats, **self._counters}

    def __repr__(self) -> str:
        groups = [{name: g[name] for name in GROUP_HYPERPARAMETERS} for g in self.param_groups]
        return (f"TulaOptimizer(large_batch={self.large_batch}, small_batch={self.small_batch}, "
                f"granularity={self.granularity!r}, source={self.source!r}, "
                f"estimator={self.estimator!r}, refresh_every={self.refresh_every!r}, "
                f"groups={groups}, base={self.base!r})")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the base optimizer and to AGS (AGS hyper-parameters default)."""
        if not any(param_group is group for group in self.base.param_groups):
            self.base.add_param_group(param_group)  # a user's new group: the base owns it
        for name, default in self.defaults.items():
            param_group.setdefault(name, default)
        check_group(param_group)
        if not any(param_group is group for group in self.param_groups):
            self.param_groups.append(param_group)  # only while Optimizer.__init__ runs

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter of every group, in state_dict order."""
        return [p for group in self.param_groups for p in group["params"]]

    @property
    def scales(self) -> dict[nn.Parameter, torch.Tensor]:
        """The scales in effect, by parameter (absent: 1, Algorithm 1's input)."""
        return {p: state["scale"] for p, state in self.state.items() if "scale" in state}

    @property
    def measured_batch(self) -> int:
        """b, the batch the small-batch gradient averages over (source "local": B/N)."""
        if self.source == "local":
            return self.large_batch // world_size(self.process_group)
        return self.small_batch

    def resize(self, old: int, new: int) -> None:
        """Train at large batch `new` (was `old`) from the next step (an adaptive global
        batch): the gain is AdaScale's at the new B, and a default s_max, Algorithm 1 line
        12's ceiling, follows it; the scales and progress carry on, and the next refresh
        carries the moving averages to the new batches (`carried_sq_norms`)."""
        self.large_batch = int(new)
        if self.s_max_given:
            return
        for group in self.param_groups:
            group["s_max"] = max_scale(self.large_batch, self.small_batch,
                                       group["gain_exponent"])

    @property
    def plain(self) -> bool:
        """Whether B is no larger than the reference small batch (an adaptive batch at a
        small B): the large batch is then a small one, the gain is 1 and there is nothing
        to scale, so a step is the base optimizer's alone, as `ags` and `ags-ns` build at
        such a B. No small-batch gradient is taken (`refresh_due` is False)."""
        return self.large_batch <= self.small_batch

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base.zero_grad(set_to_none=set_to_none)

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
        if self.plain:
            self._plain_step()
            return loss
        with torch.no_grad():
            # The observed small-batch gradients; p.grad is the large-batch one (all-reduced
            # under DDP, unscaled under fp16).
            local = self._unscaled_observed() if self._local else None
            if local:
                self._refresh(local, norms=self.granularity == "tensor")
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            # One host sync per step on GPU: the decision is a Python branch.
            norm_sq = torch.nn.utils.get_total_norm(grads).item() ** 2 if grads else 0.0
            variability = gradient_variability(norm_sq, self._previous_norm_sq)
            scaled = False
            for group in self.param_groups:  # eq. 8 with each group's delta (None: no gate)
                if group["delta"] is not None and not variability < group["delta"]:
                    continue
                scaled = True
                for p in group["params"]:
                    scale = self.state[p].get("scale") if p in self.state else None
                    if scale is not None and p.grad is not None:
                        p.grad.mul_(scale)
            self._previous_norm_sq = norm_sq  # eq. 5 compares unscaled large-batch norms
        self.base.step()
        if self._gain is not None:  # AdaScale: this step was worth r reference steps
            self._progress = self._progress + self._gain.double()
        for state in self.state.values():  # line 10, after the weight update of line 9
            if "next_scale" in state:
                state["scale"] = state.pop("next_scale")
        self._count_step(variability, scaled)
        return loss

    def _plain_step(self) -> None:
        """The base optimizer's step at a B no larger than the reference batch (`plain`):
        worth B / b_ref reference steps to AdaScale's progress. Eq. 5 starts again after
        it (the next scaled step counts as a first one)."""
        self.base.step()
        self._progress = self._progress + self.large_batch / self.small_batch
        self._previous_norm_sq = None
        self._count_step(math.nan, scaled=False)

    def _count_step(self, variability: float, scaled: bool) -> None:
        """A step taken: the counters, and the telemetry the strategy records of it."""
        self._counters["steps"] += 1
        self._counters["scaled_steps"] += int(scaled)
        self._counters["steps_since_refresh"] += 1
        self.telemetry = {"variability": variability, "scaled": scaled,
                          **self._scale_stats, **self._counters}

    @property
    def progress(self) -> float | None:
        """AdaScale's progress: the whole model's gain summed over the steps, in steps of
        the reference batch `small_batch` (`scalar_gain`); None for the estimator
        "refresh", which keeps no running gain."""
        return float(self._progress) if self.estimator == "ema" else None

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """torch's state_dict (AGS per-parameter state, the shared param groups) plus the
        base optimizer's per-parameter state ("base_state") and AGS's counters ("ags")."""
        state = super().state_dict()
        state["base_state"] = self.base.state_dict()["state"]
        state["ags"] = {"previous_norm_sq": self._previous_norm_sq,
                        "epoch_pending": self._epoch_pending,
                        "counters": dict(self._counters), "scale_stats": dict(self._scale_stats),
                        "progress": float(self._progress),
                        "averages_at": self._averages_at}
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
        self._progress = float(ags.get("progress", 0.0))  # checkpoints before issue 25: 0
        at = ags.get("averages_at")  # None before issue 44: at the batch it resumes at
        self._averages_at = None if at is None else (int(at[0]), int(at[1]))
