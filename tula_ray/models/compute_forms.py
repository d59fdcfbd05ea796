"""Eq. 2b, compute time of one step against the local batch b, and the registry of its
forms (like `perf.COLLECTIVES` for eq. 2c): a new form is one `register_compute_form`.

Built in, tried in this order, the first that has the data's shape is kept:
  "linear"   the paper's a + c * b (a fixed cost per step plus a cost per sample); with
             three or more batches, only where it passes within LINE_TOLERANCE of each;
  "power"    c * b^p, p > 0, and a + c * b^p from three batches on: larger batches spill
             out of cache (on 2 CPU cores a step costs b^1.12), which shows as a chord
             crossing zero at a positive b; with a fixed cost a as well, the cost per
             sample falls and then rises with b, as measured on CPUs (issue 24: the
             Fashion-MNIST CNN's is 20-30 % lower at b = 64 than at b = 16 and 1024,
             which the line through the ends cannot show);
  "constant" compute that does not grow with b.
Fits minimise RELATIVE residuals: step-time noise is multiplicative (~15 % between
processes, NOTES-ENV).

A form is a fit, `fit(b, t) -> curve or None` (None: these data do not have its shape),
and its curve type: a frozen dataclass of floats, callable on b, whose `form` names the
registered form (plans store curves as {"form": name, **fields}).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class ComputeCurve:
    """Eq. 2b: compute time of one step = intercept_s + per_sample_s * b ** exponent."""

    intercept_s: float  # per-step fixed cost: kernel launches, optimizer step, Python
    per_sample_s: float  # forward + backward cost of one sample of the local batch
    exponent: float = 1.0  # 1: the paper's linear compute; > 1: convex (cache-bound) data

    def __call__(self, local_batch: np.ndarray) -> np.ndarray:
        return self.intercept_s + self.per_sample_s * np.asarray(local_batch, float) ** self.exponent

    @property
    def form(self) -> str:
        if self.exponent != 1.0:
            return "power"
        return "constant" if self.per_sample_s == 0.0 else "linear"


# A line through three or more batches that misses one of them by more than this is the
# wrong shape, not timing noise: a profiled point is a median of blocks, and the line's
# misses where the per-sample cost bends are 6-16 % (the CNN's profiles, issue 24).
LINE_TOLERANCE = 0.05
POWER_EXPONENT_BOUNDS = (0.5, 3.0)  # compute grows with b, at most as a cube

Curve = Callable[[np.ndarray], np.ndarray]
Fit = Callable[[np.ndarray, np.ndarray], Any]  # (b, t) -> a curve, or None


@dataclass(frozen=True)
class ComputeForm:
    fit: Fit
    curve_type: type


def relative_misses(curve: Curve, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    """|curve(b) / t - 1| at each point."""
    return np.abs(curve(b) / t - 1.0)


def fit_linear(b: np.ndarray, t: np.ndarray) -> ComputeCurve | None:
    """The paper's line, weighted by 1/t; None when it would need a negative fixed cost
    or slope, or, from three batches on, misses one by more than LINE_TOLERANCE. With a
    single distinct b, through the origin (eq. 2b: t proportional to b)."""
    distinct = len(np.unique(b))
    if distinct < 2:
        return ComputeCurve(0.0, float(np.median(t / b)))
    weight = 1.0 / t
    design = np.column_stack([np.ones_like(b), b]) * weight[:, None]
    intercept, slope = np.linalg.lstsq(design, t * weight, rcond=None)[0]
    if intercept < 0 or slope < 0:
        return None
    line = ComputeCurve(float(intercept), float(slope))
    if distinct >= 3 and relative_misses(line, b, t).max() > LINE_TOLERANCE:
        return None
    return line


def fit_power(b: np.ndarray, t: np.ndarray) -> ComputeCurve | None:
    """c * b^p fitted in log space; from three distinct batches on, a + c * b^p (a >= 0)
    by least squares in relative residuals, started from that chord. None unless compute
    grows with b (p > 0)."""
    exponent, log_scale = np.polyfit(np.log(b), np.log(t), 1)
    if exponent <= 0:
        return None
    chord = ComputeCurve(0.0, float(np.exp(log_scale)), float(exponent))
    if len(np.unique(b)) < 3:
        return chord
    return _with_fixed_cost(b, t, chord)


def _with_fixed_cost(b: np.ndarray, t: np.ndarray, chord: ComputeCurve) -> ComputeCurve:
    """a + c * b^p from the chord c * b^p; the chord itself where adding a fixed cost
    does not fit better."""
    from scipy.optimize import least_squares  # scipy only where three batches are fitted

    low, high = POWER_EXPONENT_BOUNDS

    def residuals(theta: np.ndarray) -> np.ndarray:
        intercept, log_scale, exponent = theta
        return (intercept + np.exp(log_scale) * b ** exponent) / t - 1.0

    start = [0.0, np.log(chord.per_sample_s), float(np.clip(chord.exponent, low, high))]
    intercept, log_scale, exponent = least_squares(
        residuals, start, bounds=([0.0, -np.inf, low], [np.inf, np.inf, high])).x
    curve = ComputeCurve(float(intercept), float(np.exp(log_scale)), float(exponent))
    if np.sum(relative_misses(curve, b, t) ** 2) < np.sum(relative_misses(chord, b, t) ** 2):
        return curve
    return chord


def fit_constant(b: np.ndarray, t: np.ndarray) -> ComputeCurve:
    """A fixed cost only: the median step."""
    return ComputeCurve(float(np.median(t)), 0.0)


COMPUTE_FORMS: dict[str, ComputeForm] = {
    "linear": ComputeForm(fit_linear, ComputeCurve),
    "power": ComputeForm(fit_power, ComputeCurve),
    "constant": ComputeForm(fit_constant, ComputeCurve),
}


def register_compute_form(name: str, fit: Fit, curve_type: type, *,
                          before: str | None = "linear") -> None:
    """Add a compute form, tried before the form `before` (default: before every built-in
    one; None: last). Its curves must be frozen dataclasses whose `form` is `name`."""
    if before is not None and before not in COMPUTE_FORMS:
        raise ValueError(f"before={before!r} is not a compute form; known: {list(COMPUTE_FORMS)}")
    forms = {key: value for key, value in COMPUTE_FORMS.items() if key != name}
    order = list(forms)
    order.insert(order.index(before) if before is not None else len(order), name)
    forms[name] = ComputeForm(fit, curve_type)
    COMPUTE_FORMS.clear()
    COMPUTE_FORMS.update((key, forms[key]) for key in order)


def unregister_compute_form(name: str) -> None:
    """Remove a form a user added (the built-in ones stay)."""
    if name in ("linear", "power", "constant"):
        raise ValueError(f"{name!r} is a built-in compute form")
    COMPUTE_FORMS.pop(name, None)


def fit_compute_curve(local_batch, compute_s) -> Curve:
    """Eq. 2b fitted to (b, compute time): the first form of COMPUTE_FORMS that has the
    data's shape (the constant form takes what none other does)."""
    b = np.asarray(local_batch, dtype=float)
    t = np.asarray(compute_s, dtype=float)
    for form in COMPUTE_FORMS.values():
        curve = form.fit(b, t)
        if curve is not None:
            return curve
    return fit_constant(b, t)


def curve_to_dict(curve: Any) -> dict[str, Any]:
    return {"form": curve.form, **asdict(curve)}


def curve_from_dict(data: dict[str, Any]) -> Any:
    """A curve from `curve_to_dict`; plans written before forms were named hold
    ComputeCurve fields only."""
    data = dict(data)
    name = data.pop("form", "linear")
    if name not in COMPUTE_FORMS:
        raise ValueError(f"compute form {name!r} is not registered (known: "
                         f"{list(COMPUTE_FORMS)}); register_compute_form it before reading")
    return COMPUTE_FORMS[name].curve_type(**data)
