"""A bootstrap interval on a ratio of two medians: how the accuracy benchmarks say how sure a
"x times faster" (or a regret, the ratio less one) is, given a few seeds per arm.

Each arm's seeds are resampled on their own, with replacement, to their own count (the arms'
seeds are independent runs); the statistic is median(a*) / median(b*); the interval is the
percentile interval of the resamples (Efron & Tibshirani 1993, ch. 13). A time that never
reached its target is +inf: it sorts above every finite time, so a median of mostly
unreached runs is inf and the ratio says so (inf, or 0 when only the denominator is).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator with the infinities of unreached targets: inf / inf is NaN
    (neither reached: no ratio), x / inf is 0, inf / x is inf."""
    if math.isinf(numerator) and math.isinf(denominator):
        return math.nan
    if math.isinf(denominator):
        return 0.0
    if denominator == 0:
        return math.inf if numerator > 0 else math.nan
    return numerator / denominator


def _median(values: np.ndarray) -> float:
    """The median, with inf allowed (numpy's interpolation of inf and a finite value is inf,
    of inf and inf is inf: what an unreached run means)."""
    return float(np.median(values))


def ratio_of_medians(numerator: Sequence[float], denominator: Sequence[float],
                     resamples: int, seed: int,
                     percentiles: tuple[float, float] = (2.5, 97.5)) -> tuple[float, float, float]:
    """(median(numerator) / median(denominator), low, high): the ratio of the two samples'
    medians and its bootstrap percentile interval over `resamples` resamples drawn with
    numpy's default_rng(seed). NaN throughout when either sample is empty."""
    a, b = np.asarray(numerator, float), np.asarray(denominator, float)
    if a.size == 0 or b.size == 0:
        return math.nan, math.nan, math.nan
    point = ratio(_median(a), _median(b))
    generator = np.random.default_rng(seed)
    draws = np.array([ratio(_median(generator.choice(a, a.size)),
                            _median(generator.choice(b, b.size))) for _ in range(resamples)])
    finite_or_inf = draws[~np.isnan(draws)]
    if finite_or_inf.size == 0:
        return point, math.nan, math.nan
    # No interpolation between order statistics: one of them may be inf.
    low, high = np.percentile(finite_or_inf, percentiles, method="inverted_cdf")
    return point, float(low), float(high)
