"""The AGS training strategies: `TulaOptimizer` over the workload's optimizer, its options,
its N/B rules and its step hooks (the refresh's extra backward, the DDP comm hook).

  "ags"     the paper's Algorithm 1, literally (per-tensor scales from a 32-sample
            sub-batch, refreshed once per epoch, gated by delta = 0.5);
  "ags-ns"  noise-scale AGS, the variant beyond the paper (user guide "AGS-NS"): the same
            optimizer with other options: per-step moving averages of the squared
            gradient norms, from each DDP worker's local gradient (the "local" source,
            no extra backward; a 32-sample sub-batch on one worker), carried to the
            reference batch 32 by the gradient-noise-scale relation (`gain_ratio`),
            s = r (AdaScale's gain exponent 1) capped at B/32, no variability gate.
Both train a global batch no larger than their reference small batch (B <= 32 by default)
with the workload's optimizer alone: the large batch is then a small one and the gain is 1, so every
(N, B) a search may plan is one they train.

No Ray here (core module); registered in `tula_ray.training.strategies.TRAINING_STRATEGIES`.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from tula_ray.ags import (SMALL_BATCH_DEFAULT, TulaOptimizer, backward_with_refresh,
                          register_local_gradient_hook)
from tula_ray.distributed import world_size
from tula_ray.training.strategy_base import (BaseStrategy, StrategySetup, check_option_names,
                                             keep_lr)

logger = logging.getLogger(__name__)

AGS_OPTIONS = ("delta", "small_batch", "refresh_every", "granularity", "s_max", "s_min", "source",
               "gain_exponent", "estimator", "ema_decay")
# AGS-NS: what differs from the paper's defaults (the rest is TulaOptimizer's). The gain
# exponent is AdaScale's 1 (the gradient scaled by r, capped at B/32): with the paper's 1/2
# the Table I analog's large batches stayed under-trained (train accuracy 0.85-0.87 at B = 1024).
NOISE_SCALE_DEFAULTS = {"estimator": "ema", "refresh_every": 1, "delta": None,
                        "gain_exponent": 1.0}


class AGSSetup(StrategySetup):
    """AGS's step hooks: mark epochs, refresh the scales in the backward, record eq. 5."""

    optimizer: TulaOptimizer

    def start_epoch(self, epoch: int) -> None:
        self.optimizer.start_epoch()

    def backward(self, model: nn.Module, loss_fn: Callable, inputs: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return backward_with_refresh(model, self.optimizer, loss_fn, inputs, targets,
                                     autocast=self.autocast, scaler=self.scaler)

    def step(self) -> None:
        """With a loss scaler, AGS learns the scale the step's gradients carry: it reads
        its small-batch norms unscaled. (A skipped step's observations are overwritten by
        the next backward's, the refresh being still due.)"""
        if self.scaler is not None:
            self.optimizer.loss_scale = float(self.scaler.get_scale())
        super().step()

    def progress(self) -> tuple[float, int] | None:
        """The optimizer's running gain summed (estimator "ema": AGS-NS), in steps of its
        reference small batch; None for the paper's per-refresh estimator."""
        done = self.optimizer.progress
        return None if done is None else (done, self.optimizer.small_batch)

    def step_telemetry(self) -> dict[str, Any]:
        telemetry = self.optimizer.telemetry
        return {"variability": float(telemetry["variability"]), "scaled": bool(telemetry["scaled"])}

    def epoch_metrics(self, telemetry: list[dict[str, Any]]) -> dict[str, Any]:
        """scaled_fraction (share of scaled steps), variability_median (eq. 5; a run's first
        step is inf and sorts last), variability (every step), the last scale statistics;
        AdaScale's progress so far (AGS-NS), in reference-batch steps; fp16's loss_scale."""
        variability = [t["variability"] for t in telemetry]
        last = self.optimizer.telemetry
        progress = self.progress()
        return {**super().epoch_metrics(telemetry),
                **({} if progress is None else {"progress": progress[0]}),
                "scaled_fraction": float(np.mean([t["scaled"] for t in telemetry])),
                "variability_median": float(np.median(variability)) if variability else math.nan,
                "variability": variability,
                **{key: float(last[key]) for key in ("scale_mean", "scale_min", "scale_max")}}


class AdaptiveGradientScaling(BaseStrategy):
    """"ags": Algorithm 1 over the workload's optimizer; options are TulaOptimizer's."""

    name, options = "ags", AGS_OPTIONS

    def search_space(self, global_batch: int) -> dict[str, tuple[Any, ...]]:
        """delta (the gate, off included), the gain exponent, the cap and the LR."""
        return {"lr": ("loguniform", 1e-3, 0.1),
                "delta": ("choice", [0.25, 0.5, 1.0, 2.0, None]),
                "gain_exponent": ("uniform", 0.5, 1.0),
                "s_max": ("loguniform", 1.0, global_batch / SMALL_BATCH_DEFAULT)}

    def one_process_options(self, num_workers: int, global_batch: int,
                            options: dict[str, Any]) -> dict[str, Any]:
        """Source "local" reads each DDP worker's gradient, which one process has not: build
        the rest as source "sub-batch" of the same small batch (default B / N)."""
        options = dict(options)
        if options.get("source") == "local":
            options.update(source="sub-batch",
                           small_batch=options.get("small_batch", global_batch // num_workers))
        return options

    def check(self, num_workers: int, global_batch: int,
              options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The small-batch gradient must come from fewer samples than a worker holds.

        Source "sub-batch" takes `small_batch` samples of each worker's local batch
        B / N, so it needs small_batch < B / N. When the default reference batch does
        not fit and the user chose neither, N >= 2 workers use source "local": each
        worker's own gradient is a small-batch gradient of B / N <= the default.
        """
        options = check_option_names(self, options)
        if self._plain(global_batch, options):
            return options, [self._plain_note(global_batch, options)]
        local = global_batch // num_workers
        if options.get("source") == "local":
            if num_workers < 2:
                raise ValueError(f"{self.name} source='local' needs >= 2 workers (the plan "
                                 "chose N=1); use source='sub-batch'")
            return options, []
        small = options.get("small_batch", SMALL_BATCH_DEFAULT)
        if small < local:
            return options, []
        if num_workers >= 2 and not {"source", "small_batch"} & set(options):
            note = (f"ags: the default reference small batch {small} does not fit in the local "
                    f"batch B/N = {local}; using source='local' (each worker's gradient, "
                    f"b = {local}) as the small-batch gradient")
            return {**options, "source": "local"}, [note]
        hint = f" or source='local' (b = {local})" if num_workers >= 2 else ""
        raise ValueError(f"{self.name} takes its small-batch gradient from {small} samples of "
                         f"each worker's local batch of {local} (B={global_batch} / "
                         f"N={num_workers}), "
                         f"which needs fewer than {local}: pass strategy_options with "
                         f"small_batch < {local}{hint}")

    def trains_plain(self, num_workers: int, global_batch: int,
                     options: dict[str, Any]) -> bool:
        """Whether the steps at (N, B) with `options` (as `check` returns them) are plain
        SGD: the plan adds no strategy cost there (`strategies.plain_steps`)."""
        return self._plain(global_batch, options)

    @staticmethod
    def _plain(global_batch: int, options: dict[str, Any]) -> bool:
        """Whether B is no larger than the reference small batch: then the large batch is a
        small one, the scale (AdaScale's gain ratio) is 1, and the steps are plain SGD.
        Source "local" without a small_batch has no fixed reference (it is B / N)."""
        if options.get("source") == "local" and "small_batch" not in options:
            return False
        return global_batch <= options.get("small_batch", SMALL_BATCH_DEFAULT)

    def _plain_note(self, global_batch: int, options: dict[str, Any]) -> str:
        return (f"{self.name}: B={global_batch} is not larger than its reference small batch "
                f"{options.get('small_batch', SMALL_BATCH_DEFAULT)}: there is nothing to scale "
                "(the gain is 1), so it trains plain steps of the workload's optimizer")

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options, optimizer_fn) -> StrategySetup:
        """The workload's optimizer wrapped in TulaOptimizer; source "local" defaults
        small_batch to B / world. At a B no larger than the reference small batch, the
        workload's optimizer alone (`_plain`)."""
        options = dict(options)
        if self._plain(global_batch, options):
            note = self._plain_note(global_batch, options)
            logger.info("%s", note)
            return StrategySetup(self.name, optimizer_fn(model.parameters()), notes=[note],
                                 rescale=keep_lr)
        if options.get("source") == "local":
            world = world_size()
            if world < 2:
                raise ValueError("ags option source='local' takes g_small from each DDP worker's "
                                 "own gradient: it needs torch.distributed with >= 2 workers "
                                 "(world size is 1); use source='sub-batch'")
            if global_batch % world:
                raise ValueError(f"global_batch={global_batch} is not divisible by the world "
                                 f"size {world}: source='local' needs equal local batches")
            options.setdefault("small_batch", global_batch // world)
        optimizer = TulaOptimizer(optimizer_fn(model.parameters()), large_batch=global_batch,
                                  **options)
        if optimizer.source == "local":  # each worker's gradient, read before the all-reduce
            register_local_gradient_hook(model, optimizer)
        return AGSSetup(self.name, optimizer, rescale=optimizer.resize)


class NoiseScaleAGS(AdaptiveGradientScaling):
    """"ags-ns": AGS-NS, `NOISE_SCALE_DEFAULTS` over the paper's; source "local" on >= 2
    workers (free: the comm hook reads the local gradients), "sub-batch" on one."""

    name = "ags-ns"

    def check(self, num_workers: int, global_batch: int,
              options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        options = check_option_names(self, options)
        if self._plain(global_batch, options):
            # Its local gradients stand for the reference batch small_batch (build): at a
            # B no larger, there is no noise to measure; plain steps.
            return options, [self._plain_note(global_batch, options)]
        if "source" not in options:
            options["source"] = "local" if num_workers >= 2 else "sub-batch"
        return super().check(num_workers, global_batch, options)

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options, optimizer_fn) -> StrategySetup:
        options = {**NOISE_SCALE_DEFAULTS, **options}
        if "source" not in options:
            options["source"] = "local" if world_size() >= 2 else "sub-batch"
        if options["source"] == "local":  # the reference batch stays b_small, not B/N
            options.setdefault("small_batch", SMALL_BATCH_DEFAULT)
        setup = super().build(model, global_batch=global_batch, steps_per_epoch=steps_per_epoch,
                              epochs=epochs, lr=lr, momentum=momentum,
                              weight_decay=weight_decay, options=options,
                              optimizer_fn=optimizer_fn)
        setup.name = self.name
        return setup
