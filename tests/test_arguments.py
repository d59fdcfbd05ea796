import math

import pytest
from hypothesis import given, strategies as st

from tula_ray import arguments as a


@pytest.mark.parametrize("call, error, message", [
    (lambda: a.check_int("epochs", 0, minimum=1), ValueError, "epochs=0; it must be an integer >= 1"),
    (lambda: a.check_int("epochs", True, minimum=1), TypeError, "epochs=True"),
    (lambda: a.check_int("epochs", 2.0, minimum=1), TypeError, "epochs=2.0"),
    (lambda: a.check_int("seed", "0"), TypeError, "seed='0'; it must be an integer"),
    (lambda: a.check_number("lr", 0, low=0, low_open=True), ValueError, r"lr=0.0; .* \(0, inf\]"),
    (lambda: a.check_number("lr", math.nan, low=0), ValueError, "lr=nan"),
    (lambda: a.check_number("lr", math.inf, low=0), ValueError, "lr=inf"),
    (lambda: a.check_number("headroom", "0.1", low=0, high=1), TypeError, "headroom='0.1'"),
    (lambda: a.check_number("headroom", 1.0, low=0, high=1, high_open=True), ValueError,
     r"within \[0, 1\)"),
    (lambda: a.check_choice("objective", "slow", ("time", "cost")), ValueError,
     r"objective='slow' is not allowed; use one of \('time', 'cost'\)"),
    (lambda: a.check_choice("objective", 3, ("time",)), TypeError, "objective=3"),
    (lambda: a.check_text("name", ""), ValueError, "name=''; it must be a non-empty string"),
    (lambda: a.check_text("name", 5, optional=True), TypeError, "or None"),
    (lambda: a.check_bool("use_gpu", "yes", optional=True), TypeError, "use_gpu='yes'"),
    (lambda: a.check_mapping("options", "x"), TypeError, "options='x'; it must be a dict"),
    (lambda: a.check_mapping("options", {1: 2}), TypeError, "options has the key 1"),
    (lambda: a.check_mapping("options", {"b": 1}, allowed_keys=("a",)), ValueError,
     r"options has the unknown key 'b'; allowed: \['a'\]"),
])
def test_each_check_names_the_argument_the_value_and_what_is_allowed(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_good_values_pass_through():
    assert a.check_int("n", 3, minimum=1) == 3 and a.check_int("n", None, optional=True) is None
    assert a.check_number("x", 1, low=0, high=1) == 1.0
    assert a.check_choice("c", "time", ("time",)) == "time"
    assert a.check_text("p", "runs") == "runs" and a.check_text("p", None, optional=True) is None
    assert a.check_mapping("m", None) == {} and a.check_mapping("m", {"a": 1}, allowed_keys="a")
    assert a.check_bool("b", False) is False


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_numbers_outside_the_span_are_refused(value):
    inside = 0.0 <= value < 1.0  # False for nan
    if inside:
        assert a.check_number("f", value, low=0, high=1, high_open=True) == value
    else:
        with pytest.raises(ValueError, match="f="):
            a.check_number("f", value, low=0, high=1, high_open=True)
