"""Adaptive Gradient Scaling's equations (paper §III-C, eq. 5 and 8, Algorithm 1 lines 12
and 16), with AdaScale's gain ratio beyond the paper; `TulaOptimizer`
(tula_ray.ags.optimizer) applies them. Pure functions of floats and tensors: no Ray,
no torch.distributed.
"""

from __future__ import annotations

import math

import torch

DELTA_DEFAULT = 0.5  # paper §IV-B / §VI: the variability threshold used in all experiments
EPS_DEFAULT = 1e-8  # Algorithm 1's numerical-stability term
SMALL_BATCH_DEFAULT = 32  # the reference small batch: NOTES-ENV's best-generalising B here
GRANULARITIES = ("tensor", "element")
SOURCES = ("sub-batch", "local")
ESTIMATORS = ("refresh", "ema")
REFRESH_EPOCH = "epoch"
GAIN_EXPONENT_PAPER = 0.5  # s = |g_small| / |g_large| = r^(1/2) (Algorithm 1 line 16)
EMA_DECAY_DEFAULT = 0.9  # moving average over ~10 refreshes (estimator "ema")


# --------------------------------------------------------------------------- the equations

def gradient_variability(norm_sq: float, previous_norm_sq: float | None) -> float:
    """Eq. 5: |(|G_i|^2 - |G_{i-1}|^2) / |G_{i-1}|^2|, the relative change of the squared norm.

    Without a previous step (or after a zero gradient) the change is unbounded:
    the step counts as sensitive.
    """
    if previous_norm_sq is None or previous_norm_sq == 0.0:
        return math.inf
    return abs((norm_sq - previous_norm_sq) / previous_norm_sq)


def max_scale(large_batch: int, small_batch: int,
              gain_exponent: float = GAIN_EXPONENT_PAPER) -> float:
    """Algorithm 1 line 12: s_max = sqrt(B_large / B_small); for a gain exponent p,
    (B_large / B_small)^p (AdaScale's ceiling on r is B/b)."""
    if gain_exponent == GAIN_EXPONENT_PAPER:
        return math.sqrt(large_batch / small_batch)
    return (large_batch / small_batch) ** gain_exponent


def gain_ratio(norm_ratio: torch.Tensor, *, large_batch: int, measured_batch: int,
               reference_batch: int) -> torch.Tensor:
    """AdaScale's gain ratio r = E|g_bref|^2 / E|g_B|^2 from |g_b| / |g_B| measured at batch b.

    McCandlish et al.: E|g_b|^2 = |G|^2 + tr(Sigma) / b. With x = |g_b|^2 / |g_B|^2,
    r(b_ref) = 1 + (x - 1) (B / b_ref - 1) / (B / b - 1); r = x when b_ref = b.
    """
    x = norm_ratio.square()
    if measured_batch == reference_batch:
        return x
    carry = (large_batch / reference_batch - 1) / (large_batch / measured_batch - 1)
    return 1 + (x - 1) * carry


def carried_sq_norms(small_sq: torch.Tensor, large_sq: torch.Tensor, *,
                     measured_from: int, large_from: int, measured_to: int,
                     large_to: int) -> tuple[torch.Tensor, torch.Tensor]:
    """E|g_b|^2 and E|g_B|^2 at new batches (b, B) from those measured at (b0, B0): the
    moving averages carried across a change of the global batch (an adaptive batch).

    McCandlish et al.: E|g_b|^2 = |G|^2 + tr(Sigma) / b is linear in 1 / b, so the two
    measured points fix the line and the new points are read off it (exact in
    expectation: averages of |g_b0|^2 and |g_b|^2 mixed would read the noise at the
    wrong batch). Clamped at 0: a line whose |G|^2 is negative (all noise) would read
    a negative norm at a larger batch; the gain is then AdaScale's ceiling.
    """
    x_small, x_large = 1.0 / measured_from, 1.0 / large_from
    if x_small == x_large:
        raise ValueError(f"measured_from={measured_from} equals large_from={large_from}: "
                         "two batches are needed to carry the norms")
    noise = (small_sq - large_sq) / (x_small - x_large)  # tr(Sigma)
    signal = large_sq - noise * x_large  # |G|^2
    return ((signal + noise / measured_to).clamp(min=0.0),
            (signal + noise / large_to).clamp(min=0.0))


def scalar_gain(small_sq: torch.Tensor, large_sq: torch.Tensor, *, large_batch: int,
                measured_batch: int, reference_batch: int) -> torch.Tensor:
    """AdaScale's gain ratio for the whole model (Johnson et al. 2020, "AdaScale SGD"):
    r = E|g_bref|^2 / E|g_B|^2 from |g_b|^2 and |g_B|^2 summed over every tensor
    (`gain_ratio`), bounded to AdaScale's [1, B / b_ref]: the reference-batch steps one
    step at B is worth, from 1 (all signal: the larger batch only repeats the gradient)
    to B / b_ref (all noise: it averages away B / b_ref steps' worth of it)."""
    ratio = (small_sq / large_sq.clamp(min=torch.finfo(large_sq.dtype).tiny)).sqrt()
    r = gain_ratio(ratio, large_batch=large_batch, measured_batch=measured_batch,
                   reference_batch=reference_batch)
    return r.clamp(min=1.0, max=max(1.0, large_batch / reference_batch))


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
