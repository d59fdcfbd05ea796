"""Eq. 2b's forms (tula_ray.models.compute_forms): the built-in order, and a form a user adds in
one place, through the fit, a plan's JSON and back."""

from dataclasses import dataclass

import numpy as np
import pytest

from tula_ray.models import compute_forms
from tula_ray.models import perf
from tula_ray.models.compute_forms import ComputeCurve, fit_compute_curve

B = np.array([16.0, 32, 64, 128, 256])


@dataclass(frozen=True)
class Quadratic:
    """A user's form: t = a + c * b^2."""
    intercept_s: float
    square_s: float
    form = "quadratic"  # a class attribute: not a field, so not stored twice

    def __call__(self, local_batch):
        return self.intercept_s + self.square_s * np.asarray(local_batch, float) ** 2


def fit_quadratic(b, t):
    """None unless the data are this shape: within 5 % of the fitted curve everywhere."""
    design = np.column_stack([np.ones_like(b), b ** 2]) / t[:, None]
    a, c = np.linalg.lstsq(design, np.ones_like(t), rcond=None)[0]
    curve = Quadratic(float(a), float(c))
    fits = a >= 0 and c > 0 and np.max(np.abs(curve(b) / t - 1)) < 0.05
    return curve if fits else None


@pytest.fixture
def quadratic():
    compute_forms.register_compute_form("quadratic", fit_quadratic, Quadratic)
    yield
    compute_forms.unregister_compute_form("quadratic")


def test_built_in_forms_in_order_line_then_power_then_constant():
    assert list(compute_forms.COMPUTE_FORMS) == ["linear", "power", "constant"]
    assert fit_compute_curve(B, 0.01 + 2e-4 * B).form == "linear"
    convex = fit_compute_curve(B, 3e-4 * B ** 1.12)
    assert convex.form == "power" and convex.exponent == pytest.approx(1.12)
    assert fit_compute_curve(B, 0.05 - 1e-5 * B).form == "constant"  # falls with b


def test_a_registered_form_is_tried_first_and_survives_a_plans_json(quadratic):
    assert list(compute_forms.COMPUTE_FORMS)[0] == "quadratic"
    curve = fit_compute_curve(B, 0.002 + 1e-6 * B ** 2)
    assert isinstance(curve, Quadratic) and curve.square_s == pytest.approx(1e-6)
    linear = fit_compute_curve(B, 0.01 + 2e-4 * B)  # not its shape: the next form's
    assert isinstance(linear, ComputeCurve) and linear.form == "linear"
    params = perf.PerfParams({2: curve}, linear, 0.01, "ring")
    again = perf.PerfParams.from_dict(params.to_dict())
    assert again.compute[2] == curve and again.compute_pooled == linear
    assert perf.predict_compute_s(again, 2, 128) == pytest.approx(0.002 + 1e-6 * 128 ** 2)


def test_a_form_registered_last_yields_to_the_built_in_ones():
    compute_forms.register_compute_form("quadratic", fit_quadratic, Quadratic, before=None)
    try:
        assert list(compute_forms.COMPUTE_FORMS)[-1] == "quadratic"
        assert isinstance(fit_compute_curve(B, 0.002 + 1e-6 * B ** 2), ComputeCurve)
    finally:
        compute_forms.unregister_compute_form("quadratic")
    assert "quadratic" not in compute_forms.COMPUTE_FORMS


def test_unknown_forms_are_named():
    with pytest.raises(ValueError, match="before='cubic' is not a compute form"):
        compute_forms.register_compute_form("q", fit_quadratic, Quadratic, before="cubic")
    with pytest.raises(ValueError, match="compute form 'quadratic' is not registered"):
        compute_forms.curve_from_dict({"form": "quadratic", "intercept_s": 0, "square_s": 1})
    with pytest.raises(ValueError, match="built-in"):
        compute_forms.unregister_compute_form("linear")


def test_plans_written_before_forms_were_named_still_read():
    old = {"intercept_s": 0.004, "per_sample_s": 1.5e-4, "exponent": 1.0}
    assert compute_forms.curve_from_dict(old) == ComputeCurve(0.004, 1.5e-4)


def test_three_batches_bend_the_curve_where_the_cost_per_sample_falls_then_rises():
    """The CNN's shape on 2 CPU cores (issue 24): a fixed cost per step and a convex
    cost per sample; the line through the ends over-predicts the batches between."""
    def truth(b):
        return 4.5e-3 + 1.9e-4 * np.asarray(b, float) ** 1.17
    ends, profiled = np.array([16.0, 1024]), np.array([16.0, 128, 1024])
    inner = np.array([32.0, 64, 256, 512])
    chord = fit_compute_curve(ends, truth(ends))
    assert np.max(chord(inner) / truth(inner) - 1) > 0.15  # what two ends give
    bent = fit_compute_curve(profiled, truth(profiled))
    assert bent.form == "power"
    assert (bent.intercept_s, bent.per_sample_s, bent.exponent) == pytest.approx(
        (4.5e-3, 1.9e-4, 1.17), rel=1e-3)
    assert np.max(np.abs(bent(inner) / truth(inner) - 1)) < 1e-3


def test_a_line_through_three_batches_is_kept_within_its_tolerance():
    b = np.array([16.0, 128, 1024])
    line = 0.01 + 2e-4 * b
    assert fit_compute_curve(b, line).form == "linear"
    nudged = line * np.array([1.0, 1 + 0.8 * compute_forms.LINE_TOLERANCE, 1.0])
    assert fit_compute_curve(b, nudged).form == "linear"  # within the timing's noise
    bent = line * np.array([1.0, 1 - 2 * compute_forms.LINE_TOLERANCE, 1.0])
    assert fit_compute_curve(b, bent).form == "power"
    assert fit_compute_curve(b, bent)(b) == pytest.approx(bent, rel=1e-3)
