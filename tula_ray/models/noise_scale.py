"""The gradient noise scale (issue 25, item 1): how much of a gradient is signal and how
much is sampling noise, from which the plan learns how many more steps a larger batch
needs (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"; AdaptDL and
Pollux measure it the same way while training).

Two gradient estimates of one model at one point, averaged over b samples (each worker's
own gradient, or a sub-batch's) and over B > b samples (their mean), give unbiased
estimates of the true gradient's squared norm |G|^2 and of the per-sample covariance's
trace tr(Sigma), since E|g_b|^2 = |G|^2 + tr(Sigma) / b (`signal_and_noise`). A single
step's pair is noisy: `NoiseAverage` averages each step's two estimates over steps (a
running mean, or a moving average with bias correction for a model that moves) before
taking the ratio. The noise scale phi = tr(Sigma) / |G|^2 (`noise_scale`) is the batch at which
a step's noise equals its signal.

No Ray, no torch (core module): squared norms arrive as floats.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


def signal_and_noise(small_sqr: float, small_batch: float, large_sqr: float,
                     large_batch: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from the squared norms of a b-sample and a B-sample gradient of
    the same model (McCandlish et al. 2018, Appendix A.1, eqs. A.2 and A.3):

        |G|^2     = (B |g_B|^2 - b |g_b|^2) / (B - b)
        tr(Sigma) = (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

    tr(Sigma) is the trace of one sample's gradient covariance. Either may come out
    negative from a noisy pair: average them over steps before their ratio."""
    if not 0 < small_batch < large_batch:
        raise ValueError(f"need 0 < small_batch < large_batch, got small_batch={small_batch}, "
                         f"large_batch={large_batch}")
    grad_sqr = (large_batch * large_sqr - small_batch * small_sqr) / (large_batch - small_batch)
    grad_var = (small_sqr - large_sqr) / (1.0 / small_batch - 1.0 / large_batch)
    return grad_sqr, grad_var


def noise_scale(grad_sqr: float, grad_var: float) -> float:
    """phi = tr(Sigma) / |G|^2, McCandlish et al.'s simple noise scale B_simple (eq. 2.8):
    the batch whose gradient noise equals the gradient; inf when no signal is measured."""
    if not grad_sqr > 0:
        return math.inf
    return max(grad_var, 0.0) / grad_sqr


def efficiency(noise_scale: float, global_batch: float, reference_batch: float) -> float:
    """E(B) = (phi + M0) / (phi + B): the share of a step at B that counts, measured in
    epochs at the reference batch M0 (McCandlish et al. eq. 2.11, epochs = E_min (1 + B /
    B_noise), taken at B over M0; Pollux's statistical efficiency). An epoch budget E0 at
    M0 becomes E0 / E(B) at B."""
    if math.isinf(noise_scale):
        return 1.0  # all noise: every sample counts alike, whatever the batch
    return (noise_scale + reference_batch) / (noise_scale + global_batch)


@dataclass
class NoiseAverage:
    """Each step's pair turned into unbiased estimates of |G|^2 and tr(Sigma)
    (`signal_and_noise`), averaged over steps; phi from the averages' ratio.

    The estimates, not the squared norms, are averaged: E|g_b|^2 = |G|^2 + tr(Sigma) / b
    is linear in 1 / b, so squared norms of pairs at different batches (an adaptive run
    switching B) averaged with their batches would weigh each pair's noise by the wrong
    batch: half the pairs at b = 16 and half at b = 256 read tr(Sigma) 4.5x too large.
    Each step's estimate is unbiased whatever its batches; at constant batches the two
    ways are the same numbers (both linear).

    decay None and timescale_samples None: the running mean (a profile, where the model
    barely moves). decay in (0, 1): an exponential moving average per step with Adam's
    bias correction (dividing by the weights' sum, 1 - decay^t). timescale_samples T > 0:
    the same, each step's decay exp(-B / T) for a step of B samples (its `large_batch`),
    so a pair S samples ago weighs exp(-S / T) whatever the batch: AdaptDL's
    `GradientNoiseScale` counts its smoothing 0.999 per local batch alike, and averages
    the per-step estimates as here (a training run, where the noise scale drifts;
    `tula_ray.training.online_noise`)."""

    decay: float | None = None
    grad_sqr: float = 0.0  # the weighted sum of the steps' |G|^2 estimates
    grad_var: float = 0.0  # ... and of their tr(Sigma) estimates
    weight: float = 0.0  # the sum of the steps' weights (bias correction's denominator)
    steps: int = 0
    timescale_samples: float | None = None

    def __post_init__(self) -> None:
        if self.decay is not None and not 0.0 < self.decay < 1.0:
            raise ValueError(f"decay={self.decay!r}: use None (a running mean) or a number "
                             "in (0, 1)")
        if self.timescale_samples is not None and not self.timescale_samples > 0:
            raise ValueError(f"timescale_samples={self.timescale_samples!r}: use None or a "
                             "positive number of samples")
        if self.decay is not None and self.timescale_samples is not None:
            raise ValueError(f"decay={self.decay!r} and timescale_samples="
                             f"{self.timescale_samples!r}: give one of them")

    def _keep(self, large_batch: float) -> float:
        """The share of the average a new step keeps."""
        if self.timescale_samples is not None:
            return math.exp(-large_batch / self.timescale_samples)
        return (self.steps / (self.steps + 1)) if self.decay is None else self.decay

    def update(self, small_sqr: float, small_batch: float, large_sqr: float,
               large_batch: float) -> None:
        """Add one step's pair: |g_b|^2 over b samples and |g_B|^2 over B samples."""
        if not (math.isfinite(small_sqr) and math.isfinite(large_sqr)):
            return  # an overflowed step (fp16), or no pair (NaN), carries no estimate
        grad_sqr, grad_var = signal_and_noise(small_sqr, small_batch, large_sqr, large_batch)
        keep = self._keep(large_batch)
        self.grad_sqr = keep * self.grad_sqr + (1 - keep) * grad_sqr
        self.grad_var = keep * self.grad_var + (1 - keep) * grad_var
        self.weight = keep * self.weight + (1 - keep)
        self.steps += 1

    def estimate(self) -> tuple[float, float]:
        """(|G|^2, tr(Sigma)) from the averages; (nan, nan) before any step."""
        if self.steps == 0:
            return math.nan, math.nan
        return self.grad_sqr / self.weight, self.grad_var / self.weight

    @property
    def noise_scale(self) -> float:
        grad_sqr, grad_var = self.estimate()
        return noise_scale(grad_sqr, grad_var) if self.steps else math.nan

    def state_dict(self) -> dict[str, Any]:
        """Every field, plain numbers (a checkpoint carries it; `load_state_dict` resumes)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = _estimates_of_norms(state)
        unknown = sorted(set(state) - set(asdict(self)))
        if unknown:
            raise ValueError(f"not a NoiseAverage state: unknown keys {unknown}; expected "
                             f"{sorted(asdict(self))}")
        for name, value in state.items():
            setattr(self, name, value)
        self.__post_init__()


NORM_KEYS = ("small_sqr", "small_batch", "large_sqr", "large_batch")


def _estimates_of_norms(state: dict[str, Any]) -> dict[str, Any]:
    """A state saved before the averages held estimates (2026-11-29: the squared norms and
    batches averaged apart) as this version's: its estimates from its averages, what it
    read then. Any other state as it is."""
    if not set(NORM_KEYS) <= set(state):
        return state
    state = dict(state)
    sums = [state.pop(key) for key in NORM_KEYS]
    if state.get("steps"):
        weight = state["weight"]
        grad_sqr, grad_var = signal_and_noise(*(value / weight for value in sums))
        state["grad_sqr"], state["grad_var"] = grad_sqr * weight, grad_var * weight
    return state
