"""Time to accuracy (issue 25, item 2): how many epochs each batch needs to reach what the
workload's epochs reach at the reference batch M0, and what those epochs take.

A larger batch averages away gradient noise that a small one would have spent steps on,
so it needs fewer steps but more epochs to the same accuracy (McCandlish et al. 2018):
an epoch budget E0 at M0 becomes E0 / E(B) at B, E(B) = (phi + M0) / (phi + B)
(`tula_ray.models.noise_scale.efficiency`), phi the gradient noise scale. Every profile
row measured |G|^2 and tr(Sigma) on the barely trained model (`profiled_noise`); the
plan may scale the pooled phi by a calibration (`NOISE_CALIBRATION_DEFAULT`, 1: none)
toward the phi that governs a run.

Core: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from tula_ray.models.noise_scale import efficiency, noise_scale
from tula_ray.models.pricing import Pricing
from tula_ray.profile_table import usable

REFERENCE_BATCH_DEFAULT = 32  # M0: the batch whose epochs the workload's epochs count
# None (1). The profiles' pooled phi (150-167 in three CNN searches) is close to the phi
# AGS-NS's own gain sees over a whole run (177-214, `equal-progress`) and to the phi that
# fits the measured epochs to 82 and 86 % (112 and 150, `time-to-accuracy`, 2026-11-27),
# not to 87 %'s (341): the phi that matters grows with the target, which one constant
# cannot follow. The pooled rows include large batches measured after hundreds of steps,
# not the step-100 plain-SGD phi that `noise-evolution`'s 7.18 (epoch-end over step 100)
# scales: with 7.18 the plan's phi was 6-12x too high (BENCHMARKS.md, 2026-11-26; the
# time-to-accuracy ground truth informed this choice).
NOISE_CALIBRATION_DEFAULT = 1.0


@dataclass(frozen=True)
class ProfiledNoise:
    """The gradient noise the profiles measured, pooled over their rows, and the noise
    scale the plan uses: phi = calibration x tr(Sigma) / |G|^2 (nan: nothing measured)."""

    grad_sqr: float
    grad_var: float
    steps: int
    rows: int
    calibration: float

    @property
    def measured_noise_scale(self) -> float:
        """tr(Sigma) / |G|^2 as profiled: inf when no signal was measured."""
        if self.steps == 0:
            return math.nan
        return noise_scale(self.grad_sqr, self.grad_var)

    @property
    def noise_scale(self) -> float:
        return self.calibration * self.measured_noise_scale

    def to_dict(self) -> dict:
        """As JSON, which has no nan or inf: None for either (the steps say which)."""
        data = {**asdict(self), "measured_noise_scale": self.measured_noise_scale,
                "noise_scale": self.noise_scale}
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "ProfiledNoise":
        return cls(*(math.nan if data[k] is None else data[k]
                     for k in ("grad_sqr", "grad_var", "steps", "rows", "calibration")))

    def describe(self, reference_batch: int) -> str:
        if self.steps == 0:
            return ("gradient noise: not measured by these profiles; to-accuracy figures "
                    "count the workload's epochs at every batch")
        phi = self.noise_scale
        shown = "inf (no signal measured: every batch needs the same epochs)" \
            if math.isinf(phi) else f"{phi:.4g}"
        return (f"gradient noise scale phi = {shown}: {self.calibration:g} x the "
                f"{self.measured_noise_scale:.4g} measured over {self.steps} steps of "
                f"{self.rows} profiles; epochs to target = epochs at M0={reference_batch} / "
                "E(B), E(B) = (phi + M0) / (phi + B)")


def profiled_noise(profiles: pd.DataFrame,
                   calibration: float = NOISE_CALIBRATION_DEFAULT) -> ProfiledNoise:
    """|G|^2 and tr(Sigma) pooled over the usable rows, each weighted by its steps: every
    row's pair is an unbiased estimate of the same two quantities of one (barely moved)
    model, whatever its N and B, so their weighted mean is the pooled estimate."""
    if not calibration > 0:
        raise ValueError(f"noise_calibration={calibration!r}; it must be a positive number")
    rows = usable(profiles)
    if "grad_sqr" in rows:
        rows = rows.dropna(subset=["grad_sqr", "grad_var", "noise_steps"])
        rows = rows[rows["noise_steps"] > 0]
    else:
        rows = rows.iloc[0:0]
    if rows.empty:
        return ProfiledNoise(math.nan, math.nan, 0, 0, calibration)
    weight = rows["noise_steps"].to_numpy(float)
    return ProfiledNoise(float(np.average(rows["grad_sqr"], weights=weight)),
                         float(np.average(rows["grad_var"], weights=weight)),
                         int(weight.sum()), len(rows), calibration)


def epochs_to_target(epochs: float, phi: float, global_batch: np.ndarray,
                     reference_batch: float) -> np.ndarray:
    """E0 / E(B): the epochs at B that do the work of `epochs` at the reference batch
    (McCandlish et al. eq. 2.11 with E(B) = (phi + M0) / (phi + B)); `epochs` everywhere
    when phi is unknown (nan)."""
    batches = np.asarray(global_batch, dtype=float)
    if math.isnan(phi):
        return np.full(batches.shape, float(epochs))
    gain = np.array([efficiency(phi, b, reference_batch) for b in batches.ravel()])
    return epochs / gain.reshape(batches.shape)


def add_time_to_accuracy(frame: pd.DataFrame, noise: ProfiledNoise, reference_batch: int,
                         epochs: int, pricing: Pricing, *,
                         peak_column: str = "peak_mem_bytes") -> None:
    """Adds `noise_scale`, `efficiency`, `epochs_to_target`, `time_to_accuracy_s` and
    `cost_to_accuracy_usd` to `frame`, from its `total_time_s` (eq. 4a: `epochs` x the
    epoch's time, evaluation and checkpoint included, plus the start-up once): the
    per-epoch part is scaled to the epochs to target, the start-up kept; the cost is
    priced with the peak memory in `peak_column`."""
    phi = noise.noise_scale
    target = epochs_to_target(epochs, phi, frame["global_batch"], reference_batch)
    startup = frame["startup_time_s"] if "startup_time_s" in frame else 0.0
    per_epoch = (frame["total_time_s"] - startup) / epochs
    frame["noise_scale"] = phi if math.isfinite(phi) else math.nan  # inf: JSON has none
    frame["efficiency"] = epochs / target
    frame["epochs_to_target"] = target
    frame["time_to_accuracy_s"] = target * per_epoch + startup
    frame["cost_to_accuracy_usd"] = pricing.cost_usd(
        frame["time_to_accuracy_s"].to_numpy(float), frame["num_workers"].to_numpy(float),
        frame[peak_column].to_numpy(float))
