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
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Bootstrap:
    """A protocol's bootstrap: `resamples` resamples of each arm's seeds, numpy
    default_rng(seed), the percentile interval between `percentiles`."""

    resamples: int = 10_000
    seed: int = 0
    percentiles: tuple[float, float] = (2.5, 97.5)


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
    draws = [ratio(_median(generator.choice(a, a.size)), _median(generator.choice(b, b.size)))
             for _ in range(resamples)]
    return (point, *percentile_interval(draws, percentiles))


def percentile_interval(draws: Sequence[float],
                        percentiles: tuple[float, float] = (2.5, 97.5)) -> tuple[float, float]:
    """(low, high): the draws' percentiles, NaN draws left out, each end an order statistic
    (no interpolation: one of them may be inf); NaN when no draw is a number."""
    kept = np.asarray(draws, float)
    kept = kept[~np.isnan(kept)]
    if kept.size == 0:
        return math.nan, math.nan
    low, high = np.percentile(kept, percentiles, method="inverted_cdf")
    return float(low), float(high)
