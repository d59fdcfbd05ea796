"""The online-noise benchmark's statistics (`benchmarks.accuracy.online_noise`): phi of a
list of recorded pairs, averaged as the online estimator or as `measure_noise_scale`
does, and a checkpoint's agreement row with bootstrap intervals. Pure functions of the
pairs: no training, no Ray.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def phi_of(pairs: list[tuple], timescale_samples: float | None) -> float:
    """phi of `pairs` averaged as the estimator does (a timescale: the online one's) or
    pooled as `measure_noise_scale` does (None: a running mean)."""
    from tula_ray.models.noise_scale import NoiseAverage

    average = NoiseAverage(timescale_samples=timescale_samples)
    for pair in pairs:
        average.update(*pair)
    return average.noise_scale


def resampled(pairs: list[tuple], timescale_samples: float | None, resamples: int,
              generator: np.random.Generator) -> np.ndarray:
    """phi of `resamples` resamples of the pairs (with replacement, kept in order)."""
    return np.array([phi_of([pairs[i] for i in sorted(generator.integers(0, len(pairs),
                                                                          len(pairs)))],
                            timescale_samples) for _ in range(resamples)])


def agreement_at(epoch: int, online: list[tuple], reference: list[tuple],
                 settings: dict[str, Any]) -> dict[str, Any]:
    """One checkpoint's row: each phi with its 95 % interval, and their ratio's (the two
    resampled apart, the ratio of each draw)."""
    from tula_ray.training.online_noise import TIMESCALE_SAMPLES_DEFAULT

    generator = np.random.default_rng(settings["seed"])
    draws = {name: resampled(pairs, timescale, settings["bootstrap"], generator)
             for name, pairs, timescale in (("online", online, TIMESCALE_SAMPLES_DEFAULT),
                                            ("reference", reference, None))}
    row = {"epoch": epoch, "pairs": len(online), "reference_pairs": len(reference),
           "online": phi_of(online, TIMESCALE_SAMPLES_DEFAULT),
           "reference": phi_of(reference, None)}
    row["ratio"] = row["online"] / row["reference"]
    for name, values in (*draws.items(), ("ratio", draws["online"] / draws["reference"])):
        row[f"{name}_low"], row[f"{name}_high"] = np.percentile(values, [2.5, 97.5]).tolist()
    return row
