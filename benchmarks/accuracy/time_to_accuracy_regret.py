"""The time-to-accuracy re-run's report pieces (protocol version 2,
`benchmarks.accuracy.time_to_accuracy_protocol`), pure: the regret of a choice with its
bootstrap interval, and the "train at M0" baseline row.

times_by_batch: per B the times to one target of its runs, one per seed (+inf: never
reached). The best B is the one with the least median time; in each bootstrap resample every
B's seeds are drawn again (numpy default_rng(seed), with replacement, to their count) and the
best is picked again, so the interval carries the choice of the best as well as the chosen
B's own spread.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from benchmarks.common import markdown_table
from benchmarks.common.bootstrap import Bootstrap, percentile_interval, ratio

Interval = tuple[float, float, float]  # (point, low, high)


def _medians(samples: Mapping[int, np.ndarray]) -> dict[int, float]:
    return {b: float(np.median(t)) for b, t in samples.items()}


def _resampled(samples: Mapping[int, np.ndarray], generator) -> dict[int, float]:
    return {b: float(np.median(generator.choice(t, t.size))) for b, t in samples.items()}


def _regret(medians: Mapping[int, float], chosen: int) -> float:
    return ratio(medians[chosen], min(medians.values())) - 1


def _over(medians: Mapping[int, float], chosen: int | None, baseline: int) -> float:
    """median(chosen) / median(baseline); chosen None: the best B's."""
    top = min(medians.values()) if chosen is None else medians[chosen]
    return ratio(top, medians[baseline])


def _interval(statistic, samples: Mapping[int, np.ndarray], bootstrap: Bootstrap) -> Interval:
    generator = np.random.default_rng(bootstrap.seed)
    draws = [statistic(_resampled(samples, generator)) for _ in range(bootstrap.resamples)]
    return (statistic(_medians(samples)), *percentile_interval(draws, bootstrap.percentiles))


def _samples(times_by_batch: Mapping[int, Sequence[float]]) -> dict[int, np.ndarray]:
    return {int(b): np.asarray(t, float) for b, t in times_by_batch.items() if len(t)}


def regret_interval(times_by_batch: Mapping[int, Sequence[float]], chosen: int,
                    bootstrap: Bootstrap) -> Interval:
    """The regret of choosing B = `chosen` (median time there over the best B's, less one)
    and its bootstrap interval; NaN when `chosen` has no runs."""
    samples = _samples(times_by_batch)
    if chosen not in samples:
        return math.nan, math.nan, math.nan
    return _interval(lambda medians: _regret(medians, chosen), samples, bootstrap)


def m0_baseline(times_by_batch: Mapping[int, Sequence[float]], chosen: int | None,
                reference_batch: int, bootstrap: Bootstrap) -> dict[str, object]:
    """"Train at M0": its median time, and the chosen B's and the best B's time over it
    (below 1: faster than training at M0), each with its bootstrap interval."""
    samples = _samples(times_by_batch)
    if reference_batch not in samples:
        nan = (math.nan,) * 3
        return {"m0_s": math.nan, "chosen_over_m0": nan, "best_over_m0": nan}
    medians = _medians(samples)
    chosen_over = (_interval(lambda m: _over(m, chosen, reference_batch), samples, bootstrap)
                   if chosen in samples else (math.nan,) * 3)
    return {"m0_s": medians[reference_batch], "chosen_over_m0": chosen_over,
            "best_over_m0": _interval(lambda m: _over(m, None, reference_batch), samples,
                                      bootstrap)}


def _fmt(interval: Interval, regret: bool = False) -> str:
    point, low, high = interval
    if math.isnan(point):
        return "n/a"
    if regret:
        return f"{point:+.0%} [{low:+.0%}, {high:+.0%}]"
    return f"{point:.2f} [{low:.2f}, {high:.2f}]"


def regret_table(rows: Sequence[tuple[str, int, Interval]]) -> str:
    """One line per choice (label, its B, its regret interval), markdown."""
    return markdown_table(["choice", "B", "regret [95 % interval]"],
                          [[label, batch, _fmt(interval, regret=True)]
                           for label, batch, interval in rows])


def m0_baseline_row(target: float, reference_batch: int, baseline: Mapping[str, object]) -> list:
    """The baseline's markdown row: target, M0, its median seconds, chosen / M0, best / M0."""
    m0_s = baseline["m0_s"]
    seconds = "n/a" if math.isnan(m0_s) else (f"{m0_s:.3g}" if math.isfinite(m0_s)
                                               else "not reached")
    return [f"{target:.0%}", reference_batch, seconds, _fmt(baseline["chosen_over_m0"]),
            _fmt(baseline["best_over_m0"])]


M0_HEADER = ["target", "M0", "train at M0: median s", "chosen / M0", "best / M0"]
