import ast
import math
from pathlib import Path

import numpy as np
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


def test_an_integer_within_a_maximum():
    assert a.check_int("train_subset", 10, minimum=1, maximum=10) == 10
    with pytest.raises(ValueError, match=r"train_subset=11; it must be an integer in \[1, 10\]"):
        a.check_int("train_subset", 11, minimum=1, maximum=10)
    with pytest.raises(ValueError, match="n=3; it must be an integer <= 2"):
        a.check_int("n", 3, maximum=2)


def test_numpy_integers_count_only_when_asked():
    assert a.check_int("epochs", np.int64(3), minimum=1, numpy=True) == 3
    with pytest.raises(ValueError, match=r"epochs=.*0.*; it must be an integer >= 1"):
        a.check_int("epochs", np.int32(0), minimum=1, numpy=True)
    for value in (3.0, True, np.float64(3.0), np.bool_(True)):  # never integers
        with pytest.raises(TypeError, match="; it must be an integer >= 1"):
            a.check_int("epochs", value, minimum=1, numpy=True)
    with pytest.raises(TypeError, match="; it must be an integer >= 1"):
        a.check_int("epochs", np.int64(3), minimum=1)  # numpy's only when asked


def test_infinity_passes_only_an_infinite_bound():
    assert a.check_number("timeout_s", math.inf, low=0, high=math.inf) == math.inf
    assert a.check_number("x", -math.inf, low=-math.inf, high=0) == -math.inf
    for kwargs in ({"low": 0}, {"low": 0, "high": math.inf, "high_open": True}):
        with pytest.raises(ValueError, match="timeout_s=inf"):
            a.check_number("timeout_s", math.inf, **kwargs)
    with pytest.raises(ValueError, match="timeout_s=nan"):
        a.check_number("timeout_s", math.nan, low=0, high=math.inf)


@pytest.mark.parametrize("call, error, message", [
    (lambda: a.check_int("n", 0, minimum=1, hint="workers"), ValueError, r">= 1 \(workers\)$"),
    (lambda: a.check_number("t", "x", low=0, hint="seconds"), TypeError, r"\(seconds\)$"),
    (lambda: a.check_choice("c", "x", ("y",), hint="or an integer"), ValueError,
     r"use one of \('y',\) \(or an integer\)$"),
    (lambda: a.check_text("p", "", hint="a path"), ValueError, r"\(a path\)$"),
    (lambda: a.check_bool("b", 1, hint="a flag"), TypeError, r"True or False \(a flag\)$"),
    (lambda: a.check_mapping("m", [], hint="name -> number"), TypeError, r"\(name -> number\)$"),
])
def test_a_hint_ends_the_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


NUMBER_TYPES = {"int", "bool", "float", "np.integer", "np.floating", "numbers.Integral",
                "numbers.Real", "numbers.Number"}


def _hand_written_number_checks(tree: ast.AST) -> list[int]:
    """Lines of `isinstance(x, bool)`, `isinstance(x, int)` or `isinstance(x, (int, float))`
    (a tuple of number types only): a type check of a number, which arguments.py owns.
    A tuple that mixes in other types (`(str, int, float, bool)`) is a filter, not a check."""
    lines = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance" and len(node.args) == 2):
            continue
        kind = node.args[1]
        names = ([ast.unparse(kind)] if not isinstance(kind, ast.Tuple)
                 else [ast.unparse(element) for element in kind.elts])
        if names in (["int"], ["bool"]) or (len(names) > 1 and set(names) <= NUMBER_TYPES):
            lines.append(node.lineno)
    return lines


def test_no_module_but_arguments_hand_writes_a_number_check():
    root = Path(__file__).parents[1]
    found = []
    for package in ("tula_ray", "searchers", "trainables"):
        for path in sorted((root / package).rglob("*.py")):
            if path == root / "tula_ray" / "arguments.py":
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            found += [f"{path.relative_to(root)}:{line}" for line in _hand_written_number_checks(tree)]
    assert not found, ("check arguments through tula_ray.arguments (check_int, check_number, "
                       f"check_bool, ...), not by hand: {found}")


@pytest.mark.parametrize("source, caught", [
    ("if isinstance(n, bool) or not isinstance(n, int) or n < 1: pass", True),
    ("ok = isinstance(rate, (int, float)) and rate > 0", True),
    ("ok = isinstance(n, (int, np.integer))", True),
    ("kept = {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool))}", False),
    ("ok = isinstance(name, str)", False),
])
def test_the_scan_sees_a_hand_written_check(source, caught):
    assert bool(_hand_written_number_checks(ast.parse(source))) is caught
