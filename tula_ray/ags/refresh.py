"""AGS's scale refresh (paper Algorithm 1 lines 11-18, UPDATEGRADSCALE): when a refresh is
due, the small-batch gradients the backward observed, compared with the large-batch one
about to be applied, give the next scales; the estimators (the paper's one-refresh ratio,
or AGS-NS's moving averages with AdaScale's whole-model gain) live here.

`ScaleRefresh` is a mixin of `tula_ray.ags.optimizer.TulaOptimizer`: it reads and writes
the optimizer's state (`self.state`, `param_groups`, the counters), which
`TulaOptimizer.__init__` sets up. No Ray here (core module).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from tula_ray.ags.equations import (GAIN_EXPONENT_PAPER, REFRESH_EPOCH, carried_sq_norms,
                                    gain_ratio, scalar_gain, scale_factor)
from tula_ray.distributed import average_tensors_over_ranks


class ScaleRefresh:
    """The refresh half of `TulaOptimizer`: when to refresh, what was observed, the
    estimators. See `tula_ray.ags.optimizer` for the departures from Algorithm 1."""

    def start_epoch(self) -> None:
        """Mark an epoch boundary: with refresh_every="epoch" the next step refreshes."""
        self._epoch_pending = True

    @property
    def refresh_due(self) -> bool:
        """Whether the coming step should compute a small-batch gradient and refresh
        (never while the step is plain: B no larger than the reference batch)."""
        if self.plain:
            return False
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
        self._refresh({p: g for p, g in zip(params, small_grads) if g is not None},
                      norms=False)

    @torch.no_grad()
    def observe_small_gradients(self, params: Sequence[torch.Tensor],
                                grads: Sequence[torch.Tensor]) -> None:
        """Small-batch gradients for this step's refresh, which `step()` makes: source
        "local", this worker's gradients before the all-reduce (from the DDP comm hook,
        one bucket at a time); source "sub-batch", the sub-batch backward's. Per tensor
        only the norms are kept, per element a copy. They carry `loss_scale`."""
        if self.granularity == "element":
            self._local.update({p: g.detach().clone() for p, g in zip(params, grads)})
        else:
            self._local.update(zip(params, torch._foreach_norm([g.detach() for g in grads])))

    @torch.no_grad()
    def observed_small_sqr(self) -> torch.Tensor | None:
        """|g_b|^2 of the small-batch gradient observed for this step's refresh, summed over
        every tensor and divided by `loss_scale`^2 (a 0-d float64 tensor on the
        gradients' device, no host sync), or None when none was observed. Read it before
        `step()`, which consumes the observation (an optimizer step pre-hook does: the
        online noise scale, `tula_ray.training.online_noise`, reuses the sub-batch)."""
        if not self._local:
            return None
        values = [v.detach().float() for v in self._local.values()]
        norms = torch._foreach_norm(values) if self.granularity == "element" else values
        return torch.stack(norms).double().square().sum() / float(self.loss_scale) ** 2

    def _unscaled_observed(self) -> dict[torch.Tensor, torch.Tensor] | None:
        """The observed small-batch gradients divided by `loss_scale`, or None when one of
        them overflowed (fp16: the large-batch gradient may be finite when a sub-batch's
        is not); then this step does not refresh, and the next one tries again. The
        workers agree on it: a refresh all-reduces, and a worker's sub-batch is its own."""
        local, self._local = self._local, {}
        if self.loss_scale == 1.0 or not local:
            return local
        norms = torch.stack([torch.linalg.vector_norm(v.float()) for v in local.values()])
        finite = norms.isfinite().all().float().reshape(1)
        average_tensors_over_ranks([finite], self.process_group)
        if finite.item() < 1.0:
            return None
        return {p: v / self.loss_scale for p, v in local.items()}

    def _refresh(self, small: dict[torch.Tensor, torch.Tensor], *, norms: bool) -> None:
        """New scales (from the next step on) from small-batch gradients (or their norms)."""
        groups = [(g, p) for g in self.param_groups for p in g["params"]
                  if p in small and p.grad is not None]
        if self.estimator == "ema":
            scales = self._ema_scales(groups, small, norms)
        else:
            scales = {p: self._literal_scale(group, small[p], p.grad, norms)
                      for group, p in groups}
            average_tensors_over_ranks(list(scales.values()), self.process_group)
        for p, scale in scales.items():
            self.state[p]["next_scale"] = scale
        flat = torch.cat([s.reshape(-1).float() for s in scales.values()]) if scales \
            else torch.ones(1)
        self._scale_stats = {"scale_mean": flat.mean().item(), "scale_min": flat.min().item(),
                             "scale_max": flat.max().item()}
        self._counters["refreshes"] += 1
        self._counters["steps_since_refresh"] = 0
        self._epoch_pending = False

    def _literal_scale(self, group: dict[str, Any], small: torch.Tensor, large: torch.Tensor,
                       norms: bool) -> torch.Tensor:
        """Line 16 (estimator "refresh"), through `gain_ratio` and the exponent when those
        differ from the paper's (a measured batch other than b_small, p != 1/2)."""
        if norms:  # the local hook kept |g_b| only (per tensor)
            ratio = small / (torch.linalg.vector_norm(large) + group["eps"])
        else:
            ratio = scale_factor(small, large, s_max=math.inf, eps=group["eps"],
                                 granularity=self.granularity)
        return self._to_scale(ratio, group)

    def _ema_scales(self, groups, small, norms: bool) -> dict[torch.Tensor, torch.Tensor]:
        """Estimator "ema": moving averages of |g_b|^2 (mean over the ranks: one all-reduce)
        and |g_B|^2 per tensor; the ratio of their roots is the norm ratio."""
        if not groups:
            return {}
        self._carry_averages()
        small_sq = torch.stack([(small[p] if norms else torch.linalg.vector_norm(small[p]))
                                .float().square() for _, p in groups])
        average_tensors_over_ranks([small_sq], self.process_group)
        scales = {}
        for (group, p), small_value in zip(groups, small_sq):
            state, decay = self.state[p], group["ema_decay"]
            large_value = torch.linalg.vector_norm(p.grad).float().square()
            for key, value in (("small_sq_avg", small_value), ("large_sq_avg", large_value)):
                state[key] = value.clone() if key not in state else \
                    state[key].mul(decay).add_(value, alpha=1 - decay)
            ratio = state["small_sq_avg"].sqrt() / (state["large_sq_avg"].sqrt() + group["eps"])
            scales[p] = self._to_scale(ratio, group)
        self._averages_at = (self.measured_batch, self.large_batch)
        self._gain = scalar_gain(sum(self.state[p]["small_sq_avg"] for _, p in groups),
                                 sum(self.state[p]["large_sq_avg"] for _, p in groups),
                                 large_batch=self.large_batch, measured_batch=self.measured_batch,
                                 reference_batch=self.small_batch)
        return scales

    def _carry_averages(self) -> None:
        """Moving averages kept at other batches (the global batch changed since: an
        adaptive batch) carried to this step's (`carried_sq_norms`), so that the new
        observations are not mixed with norms of other batches."""
        here = (self.measured_batch, self.large_batch)
        if self._averages_at is None or self._averages_at == here:
            return
        (measured_from, large_from), (measured_to, large_to) = self._averages_at, here
        for state in self.state.values():
            if "small_sq_avg" in state:
                state["small_sq_avg"], state["large_sq_avg"] = carried_sq_norms(
                    state["small_sq_avg"], state["large_sq_avg"],
                    measured_from=measured_from, large_from=large_from,
                    measured_to=measured_to, large_to=large_to)
        self._averages_at = here

    def _to_scale(self, ratio: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """s = r^p bounded to [s_min, s_max]; exactly line 16 for the paper's settings."""
        exponent = group["gain_exponent"]
        if self.measured_batch == self.small_batch and exponent == GAIN_EXPONENT_PAPER:
            scale = ratio  # r^(1/2) = |g_small| / |g_large|: line 16 as printed, no rounding
        else:
            r = gain_ratio(ratio, large_batch=self.large_batch,
                           measured_batch=self.measured_batch, reference_batch=self.small_batch)
            scale = r.clamp(min=0).pow(exponent)
        return scale.clamp(min=group["s_min"], max=group["s_max"])

