"""The noise scale's trajectory over a run (issue 44, item 2): phi as a function of the
run's progress, which the plan's adaptive rows integrate goodput over
(`tula_ray.planning.adaptive_batch`).

phi grows as a model learns (McCandlish et al. 2018, §3; Pollux re-fits it while
training), and every profile row says how far its worker group had trained when it
measured its noise (`noise_after_samples`, issue 43). Where the rows show phi rising with
those samples, the trajectory is the power law phi = a x samples^k fitted to them
(`fit_power_law`, least squares in log-log, each row weighted by its noise steps),
calibrated as the plan's phi is, held at its first profiled value before it and
extrapolated past the profiles to the run's end, never above the training set (a phi
above D is one the plan warns of: `noise_checks`). A phi the user gave at the target
(`noise_scale=`) is the end point: the trajectory runs from the profiles' fitted start to
it. Where the rows show no rising trend (one level of samples, the columns NaN in a table
recorded before issue 43, no finite phi, or a falling fit, read as measurement noise),
the trajectory is the plan's phi, constant.

Progress is counted in reference-batch samples (the work of a run at M0). The profiles'
samples were trained at their own batches without a gain correction: the fit takes them
as reference samples, an approximation the trajectory's `source` states.

Core: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tula_ray.planning.accuracy import ProfiledNoise
from tula_ray.profile_table import usable

TRAJECTORY_POINTS = 17  # points the plan states (geometric in progress); linear between
KINDS = ("fitted", "given", "constant")


@dataclass(frozen=True)
class NoiseTrajectory:
    """phi at points of progress (reference samples), linear in between and held beyond.

    kind: "fitted" (the profiles' power law), "given" (from the profiles' fitted start to
      the user's phi at the target) or "constant" (the plan's phi throughout).
    progress_samples, noise_scale: the points, progress increasing from 0.
    source: one sentence saying where the points come from."""

    kind: str
    progress_samples: tuple[float, ...]
    noise_scale: tuple[float, ...]
    source: str

    def at(self, progress_samples: np.ndarray) -> np.ndarray:
        """phi at each progress, interpolated linearly between the stated points."""
        return np.interp(np.asarray(progress_samples, dtype=float),
                         self.progress_samples, self.noise_scale)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "progress_samples": list(self.progress_samples),
                "noise_scale": list(self.noise_scale), "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> "NoiseTrajectory":
        return cls(data["kind"], tuple(float(v) for v in data["progress_samples"]),
                   tuple(float(v) for v in data["noise_scale"]), data["source"])

    def describe(self) -> str:
        """phi at the start and at the end, and where the points come from."""
        first, last = self.noise_scale[0], self.noise_scale[-1]
        if self.kind == "constant":
            return f"phi = {first:.4g} throughout ({self.source})"
        return (f"phi {first:.4g} at the start -> {last:.4g} after "
                f"{self.progress_samples[-1]:.3g} reference samples ({self.kind}: "
                f"{self.source})")


def row_noise_scales(profiles: pd.DataFrame) -> pd.DataFrame:
    """The usable rows with a noise measurement and the samples trained before it: their
    `noise_after_samples`, `noise_steps` and own phi = tr(Sigma) / |G|^2 (rows with no
    signal, |G|^2 <= 0, left out: their phi is not finite)."""
    needed = ["grad_sqr", "grad_var", "noise_steps", "noise_after_samples"]
    rows = usable(profiles)
    if any(column not in rows for column in needed):
        return pd.DataFrame(columns=["noise_after_samples", "noise_steps", "phi"])
    rows = rows.dropna(subset=needed)
    rows = rows[(rows["grad_sqr"] > 0) & (rows["noise_steps"] > 0)
                & (rows["noise_after_samples"] > 0)]
    return pd.DataFrame({"noise_after_samples": rows["noise_after_samples"].astype(float),
                         "noise_steps": rows["noise_steps"].astype(float),
                         "phi": rows["grad_var"].clip(lower=0.0) / rows["grad_sqr"]}
                        ).query("phi > 0")


def fit_power_law(samples: np.ndarray, phi: np.ndarray,
                  weights: np.ndarray) -> tuple[float, float]:
    """(a, k) of phi = a x samples^k: weighted least squares of log phi on log samples
    (weights: each row's noise steps). Needs two distinct sample levels."""
    x, y = np.log(np.asarray(samples, float)), np.log(np.asarray(phi, float))
    slope, intercept = np.polyfit(x, y, 1, w=np.sqrt(np.asarray(weights, float)))
    return float(math.exp(intercept)), float(slope)


def progress_points(first_samples: float, total_samples: float) -> np.ndarray:
    """0, then `TRAJECTORY_POINTS` - 1 points geometric from `first_samples` (the profiles'
    first measurement, at most the run's end) to `total_samples`."""
    start = min(max(first_samples, 1.0), total_samples)
    return np.concatenate([[0.0], np.geomspace(start, total_samples, TRAJECTORY_POINTS - 1)])


def constant_trajectory(phi: float, total_samples: float, why: str) -> NoiseTrajectory:
    """phi throughout the run's `total_samples`."""
    return NoiseTrajectory("constant", (0.0, float(total_samples)), (phi, phi), why)


def noise_trajectory(profiles: pd.DataFrame, noise: ProfiledNoise, total_samples: float,
                     dataset_size: int) -> NoiseTrajectory | None:
    """The trajectory the adaptive rows integrate over a run of `total_samples` reference
    samples (module docstring); None when the plan has no finite phi (nothing to adapt
    to: every batch needs the same epochs)."""
    phi = noise.noise_scale
    if not math.isfinite(phi):
        return None
    if not total_samples > 0:  # a training set smaller than M0: no work to spread phi over
        return constant_trajectory(phi, 0.0, "the plan's phi; the run has no reference steps")
    given = not math.isnan(noise.given)
    rows = row_noise_scales(profiles)
    owner = "the given" if given else "the plan's"
    if rows["noise_after_samples"].nunique() < 2:
        why = ("no profile row has a finite phi and the samples trained before it (a table "
               "recorded before issue 43 has none)" if rows.empty else
               "the profiles measured their noise at one level of samples")
        return constant_trajectory(phi, total_samples, f"{owner} phi; no trend: {why}")
    a, k = fit_power_law(rows["noise_after_samples"], rows["phi"], rows["noise_steps"])
    first = float(rows["noise_after_samples"].min())
    if not k > 0:
        return constant_trajectory(phi, total_samples, f"{owner} phi; no trend: the profiles' "
                                   f"phi does not rise with their samples (fitted "
                                   f"exponent {k:.3g})")
    return _rising(a * noise.calibration, k, first, total_samples, dataset_size,
                   noise.given if given else None, len(rows))


def _rising(scale: float, exponent: float, first: float, total_samples: float,
            dataset_size: int, given: float | None, rows: int) -> NoiseTrajectory:
    """The fitted power law over the run's points (held before `first`, at most D), or,
    with a `given` end, the power law from the fit's value at `first` to it."""
    points = progress_points(first, total_samples)
    start = scale * first ** exponent
    held = np.maximum(points, min(first, total_samples))
    if given is not None:
        span = math.log(total_samples / first) if total_samples > first else 0.0
        slope = math.log(given / start) / span if span else 0.0
        values = start * (held / first) ** slope
        source = (f"the profiles' phi fitted at their first {first:.3g} samples ({rows} rows), "
                  f"then a power law to the given phi at the run's end")
        return NoiseTrajectory("given", tuple(points), tuple(values), source)
    values = np.minimum(scale * held ** exponent, float(dataset_size))
    source = (f"phi = {scale:.3g} x samples^{exponent:.3g} fitted to {rows} profile rows' "
              f"noise against the samples trained before it (taken as reference samples), "
              f"held before {first:.3g}, extrapolated to the run's end, at most D = "
              f"{dataset_size}")
    return NoiseTrajectory("fitted", tuple(points), tuple(values), source)
