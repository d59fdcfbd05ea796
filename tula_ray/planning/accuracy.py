"""Time to accuracy (issue 25, item 2): how many epochs each batch needs to reach what the
workload's epochs reach at the reference batch M0, and what those epochs take.

A larger batch averages away gradient noise that a small one would have spent steps on,
so it needs fewer steps but more epochs to the same accuracy (McCandlish et al. 2018):
an epoch budget E0 at M0 becomes E0 / E(B) at B, E(B) = (phi + M0) / (phi + B)
(`tula_ray.models.noise_scale.efficiency`), phi the gradient noise scale. Every profile
row measured |G|^2 and tr(Sigma) on the barely trained model (`profiled_noise`); the
plan may scale the pooled phi by a calibration (`NOISE_CALIBRATION_DEFAULT`, 1: none)
toward the phi that governs a run. phi grows as a model trains, and the trade-off to a
target is the one at that target (McCandlish et al.: the critical batch at a loss is the
noise scale measured there): a user who measured phi at the target (on a model trained
to it: `tula_ray.measure_noise_scale`) gives it as `noise_scale`, which the plan then
uses instead of the profiles' (BENCHMARKS.md, time to accuracy: with phi measured over
an epoch of the reference run's iterates where it reaches each target, the epochs to
every target were within |log| 0.06-0.20 of the measured; with the profiles', 0.05-0.43).

Core: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from tula_ray.arguments import check_number
from tula_ray.models.noise_scale import efficiency, noise_scale
from tula_ray.models.pricing import NodeBilling
from tula_ray.planning.target_costs import per_epoch_to_target
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
    given: float = math.nan  # the user's phi at the target (`noise_scale=`); nan: none
    grad_sqr_se: float = math.nan  # the pooled |G|^2's standard error (nan: one row)
    negative_rows: int = 0  # rows whose own |G|^2 came out negative (pooled all the same)

    @property
    def signal_floor(self) -> float:
        """The least |G|^2 the measurement can tell from 0: its standard error (0: unknown)."""
        return 0.0 if math.isnan(self.grad_sqr_se) else self.grad_sqr_se

    @property
    def has_signal(self) -> bool:
        """Whether the pooled |G|^2 stands clear of 0 by more than its standard error."""
        return self.steps > 0 and self.grad_sqr > self.signal_floor

    @property
    def measured_noise_scale(self) -> float:
        """tr(Sigma) / |G|^2 as profiled, |G|^2 floored at its standard error (a pooled
        |G|^2 near 0 would give any phi at all: the floor bounds it by what was measured);
        inf when no signal was measured and no error is known."""
        if self.steps == 0:
            return math.nan
        return noise_scale(max(self.grad_sqr, self.signal_floor), self.grad_var)

    @property
    def noise_scale(self) -> float:
        """The phi the plan uses: the given one, else the calibrated measurement."""
        if not math.isnan(self.given):
            return self.given
        return self.calibration * self.measured_noise_scale

    def to_dict(self) -> dict:
        """As JSON, which has no nan or inf: None for either (the steps say which)."""
        data = {**asdict(self), "measured_noise_scale": self.measured_noise_scale,
                "noise_scale": self.noise_scale}
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "ProfiledNoise":
        fields = ("grad_sqr", "grad_var", "steps", "rows", "calibration", "given",
                  "grad_sqr_se")
        # .get: plans written before `given` (or the error) existed carry no such key
        return cls(*(math.nan if data.get(k) is None else data[k] for k in fields),
                   negative_rows=int(data.get("negative_rows") or 0))

    def describe(self, reference_batch: int) -> str:
        rule = (f"epochs to target = epochs at M0={reference_batch} / E(B), "
                "E(B) = (phi + M0) / (phi + B)")
        if not math.isnan(self.given):
            measured = ("none measured by these profiles" if self.steps == 0 else
                        f"the profiles measured {self.measured_noise_scale:.4g} over "
                        f"{self.steps} steps of {self.rows} profiles")
            return (f"gradient noise scale phi = {self.given:.4g}, given (the noise scale "
                    f"at the target accuracy; {measured}); {rule}")
        if self.steps == 0:
            return ("gradient noise: not measured by these profiles; to-accuracy figures "
                    "count the workload's epochs at every batch")
        phi = self.noise_scale
        shown = "inf (no signal measured: every batch needs the same epochs)" \
            if math.isinf(phi) else f"{phi:.4g}"
        floored = "" if self.has_signal else (
            f", |G|^2 {self.grad_sqr:.3g} floored at its standard error "
            f"{self.grad_sqr_se:.3g}")
        negative = "" if not self.negative_rows else (
            f", {self.negative_rows} of them with a negative |G|^2")
        return (f"gradient noise scale phi = {shown}: {self.calibration:g} x the "
                f"{self.measured_noise_scale:.4g} measured over {self.steps} steps of "
                f"{self.rows} profiles{negative}{floored}; {rule}")


def profiled_noise(profiles: pd.DataFrame,
                   calibration: float = NOISE_CALIBRATION_DEFAULT,
                   noise_scale: float | None = None) -> ProfiledNoise:
    """|G|^2 and tr(Sigma) pooled over the usable rows, each weighted by its steps: every
    row's pair is an unbiased estimate of the same two quantities of one (barely moved)
    model, whatever its N and B, so their weighted mean is the pooled estimate.
    noise_scale: phi at the target accuracy, measured by the user; the plan uses it
    instead (the profiles' is kept beside it)."""
    if not calibration > 0:
        raise ValueError(f"noise_calibration={calibration!r}; it must be a positive number")
    given = check_noise_scale(noise_scale)
    given = math.nan if given is None else given
    rows = usable(profiles)
    if "grad_sqr" in rows:
        rows = rows.dropna(subset=["grad_sqr", "grad_var", "noise_steps"])
        rows = rows[rows["noise_steps"] > 0]
    else:
        rows = rows.iloc[0:0]
    if rows.empty:
        return ProfiledNoise(math.nan, math.nan, 0, 0, calibration, given)
    weight = rows["noise_steps"].to_numpy(float)
    grad_sqr = rows["grad_sqr"].to_numpy(float)
    return ProfiledNoise(float(np.average(grad_sqr, weights=weight)),
                         float(np.average(rows["grad_var"], weights=weight)),
                         int(weight.sum()), len(rows), calibration, given,
                         grad_sqr_se=weighted_standard_error(grad_sqr, weight),
                         negative_rows=int((grad_sqr < 0).sum()))


def weighted_standard_error(values: np.ndarray, weights: np.ndarray) -> float:
    """The standard error of the weighted mean of `values`, from their weighted spread and
    Kish's effective count (sum w)^2 / sum w^2; nan for fewer than 2 values."""
    if len(values) < 2:
        return math.nan
    mean = np.average(values, weights=weights)
    spread = np.average((values - mean) ** 2, weights=weights)
    effective = weights.sum() ** 2 / (weights ** 2).sum()
    return float(math.sqrt(spread / max(effective - 1.0, 1.0)))


def check_noise_scale(value: object) -> float | None:
    """A user's phi: a positive finite number (samples), or None (the profiles' phi)."""
    return check_number("noise_scale", value, low=0.0, low_open=True, high=math.inf,
                        high_open=True, optional=True,
                        hint="the gradient noise scale at the target accuracy, in samples "
                             "(tula_ray.measure_noise_scale), or None to use the profiles'")


def epochs_to_target(epochs: float, phi: float, global_batch: np.ndarray,
                     reference_batch: float, dataset_size: int | None = None) -> np.ndarray:
    """E0 / E(B): the epochs at B that do the work of `epochs` at the reference batch
    (McCandlish et al. eq. 2.11 with E(B) = (phi + M0) / (phi + B)); `epochs` everywhere
    when phi is unknown (nan), and none to scale when it is all noise (inf). With
    `dataset_size` D and a finite phi, in whole steps (`whole_step_epochs`): an epoch at B
    trains floor(D / B) x B samples, not D."""
    batches = np.asarray(global_batch, dtype=float)
    if math.isnan(phi):
        return np.full(batches.shape, float(epochs))
    gain = np.array([efficiency(phi, b, reference_batch) for b in batches.ravel()])
    target = epochs / gain.reshape(batches.shape)
    if dataset_size is None or math.isinf(phi):
        return target
    return target * whole_step_epochs(dataset_size, batches, reference_batch)


def whole_step_epochs(dataset_size: int, global_batch: np.ndarray,
                      reference_batch: float) -> np.ndarray:
    """Epochs at B per epoch at M0 for the same samples, an epoch being whole steps
    (the last incomplete batch dropped, as training does): floor(D / M0) M0 / (floor(D / B) B).
    Counted in samples, E(B) assumes D a epoch at every B: at B = 2048 on D = 10k, 8192
    samples an epoch, and the time to target 18 % short (issue 43, item 4)."""
    batches = np.asarray(global_batch, dtype=float)
    per_epoch = np.floor(dataset_size / batches) * batches
    reference = math.floor(dataset_size / reference_batch) * reference_batch
    return reference / np.where(per_epoch > 0, per_epoch, np.nan)


def add_time_to_accuracy(frame: pd.DataFrame, noise: ProfiledNoise, reference_batch: int,
                         epochs: int, billing: NodeBilling, *,
                         peak_column: str = "peak_mem_bytes",
                         dataset_size: int | None = None) -> None:
    """Adds `noise_scale`, `efficiency`, `epochs_to_target`, `time_to_accuracy_s` and
    `cost_to_accuracy_usd` to `frame`, from its `total_time_s` (eq. 4a: `epochs` x the
    epoch's time, evaluation and checkpoint included, plus the start-up once): the
    per-epoch part is scaled to the epochs to target, the start-up kept; where the frame
    prices a run to a target's evaluations (`target_extra_s`), they replace the epoch's
    test pass, which is counted once (`target_costs.per_epoch_to_target`). The cost is
    priced with the peak memory in `peak_column`, in `billing`'s whole nodes. With
    `dataset_size`, the epochs to target count whole steps (`whole_step_epochs`)."""
    phi = noise.noise_scale
    target = epochs_to_target(epochs, phi, frame["global_batch"], reference_batch, dataset_size)
    startup = frame["startup_time_s"] if "startup_time_s" in frame else 0.0
    per_epoch, once = per_epoch_to_target(frame, (frame["total_time_s"] - startup) / epochs)
    frame["noise_scale"] = phi if math.isfinite(phi) else math.nan  # inf: JSON has none
    frame["efficiency"] = epochs / epochs_to_target(epochs, phi, frame["global_batch"],
                                                    reference_batch)  # E(B), in samples
    frame["epochs_to_target"] = target
    frame["time_to_accuracy_s"] = target * per_epoch + startup + once
    frame["cost_to_accuracy_usd"] = billing.cost_usd(
        frame["time_to_accuracy_s"].to_numpy(float), frame["num_workers"].to_numpy(float),
        frame[peak_column].to_numpy(float))
