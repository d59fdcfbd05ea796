"""Bad input never reaches Ray (issue 13, item 4).

Hypothesis drives `tula_ray.search()`, `tula_ray.train()` and the YAML config of
`tula-ray search` with wrong types, out-of-range and unknown values. Each must end in a
ValueError or TypeError that names the argument, raised before Ray starts: `ray.init`
is replaced by a function that fails the test, so no session is ever started here.
"""

import contextlib
import math
from unittest import mock

import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tula_ray
from tula_ray.cli import main
from tula_ray.planning.plan import build_plan
from tula_ray.space import SearchSpace
from tula_ray.planning.synthetic import example_params, synthetic_profiles

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

# Values of the wrong type for almost any argument.
WRONG_TYPES = st.sampled_from([None, "x", [1, 2], {"a": 1}, object(), 1.5j])
NON_POSITIVE_INTS = st.integers(max_value=0)
NOT_INTS = st.sampled_from([1.5, "32", True, None, float("nan")])
NOT_FRACTIONS = st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1.0 + 1e-9),
                          st.just(float("nan")), st.just("0.5"))


@contextlib.contextmanager
def ray_must_not_start():
    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started for an argument that should have been refused")

    with mock.patch.object(ray, "init", side_effect=refuse), \
            mock.patch.object(ray, "is_initialized", return_value=False):
        yield


def assert_refused(call, argument: str) -> None:
    with ray_must_not_start(), pytest.raises((ValueError, TypeError)) as raised:
        call()
    assert argument in str(raised.value), f"the error does not name {argument!r}: {raised.value}"


RESOURCES = st.sampled_from([{}, {"CPU": 0}, {"CPU": -1}, {"CPU": "4"}, {"CPU": True},
                             {"GPU": 1.5}, {1: 2}, {"CPU": float("nan")}, "CPU", 4, ["CPU"]])
TIMEOUTS = st.sampled_from([-1, -0.5, "600", float("nan"), True, [1]])
RUNTIME_ENVS = st.sampled_from(["py_modules", 5, ["my_models"], {"env_var": {"A": "1"}},
                                {"env_vars": {"A": 1}}, {"py_modules": "my_models"},
                                {"env_vars": {"TULA_RAY_HOST_ALLOCATOR": "fast"}}])


# Not one of tula_ray.verbosity's levels 0, 1, 2.
VERBOSE_LEVELS_NOT = st.one_of(st.integers(max_value=-1), st.integers(min_value=3),
                               st.sampled_from([True, False, "2", 1.5, None, "verbose"]))


# --- search() -----------------------------------------------------------------------

NOT_SEARCH_STRATEGIES = st.text().filter(lambda t: t not in ("full", "partial", "adaptive"))
GOOD_SEARCH = dict(workload="fashion-mnist-cnn", workload_options={"data": "fake"},
                   cluster_sizes=(1, 2), min_batch=32, max_batch=256)
BAD_SEARCH = {
    "cluster_sizes": st.one_of(st.sampled_from([(), (0,), (-1, 2), ("2",), (1.5,), (True,)]),
                               WRONG_TYPES.filter(lambda v: v != [1, 2])),
    "min_batch": st.one_of(NON_POSITIVE_INTS, NOT_INTS, WRONG_TYPES),
    "max_batch": st.one_of(st.integers(min_value=-5, max_value=31), st.just("64"), st.just(1.5)),
    "objective": st.one_of(st.text().filter(lambda t: t not in ("time", "cost", "knee",
                                                                 "weighted")), WRONG_TYPES),
    "pricing": st.one_of(st.sampled_from(["hourly", "fixed:cheap", "memory:-", 5, 2.48]),
                         st.just({"kind": "spot"})),
    "weight_time": st.one_of(NOT_FRACTIONS, WRONG_TYPES),
    "device_memory_gb": st.one_of(st.floats(max_value=0), st.just(float("nan")), st.just("8")),
    "headroom": st.one_of(NOT_FRACTIONS, WRONG_TYPES),
    "collective": st.one_of(st.text().filter(lambda t: t not in ("ring", "ps")), WRONG_TYPES),
    "warmup_steps": st.one_of(st.integers(max_value=-1), NOT_INTS),
    "measure_steps": st.one_of(NON_POSITIVE_INTS, NOT_INTS),
    "storage_path": st.sampled_from([5, 1.5, ["runs"], {"path": "runs"}]),
    "name": st.sampled_from([5, 1.5, ["trial"], ""]),
    "workload": st.one_of(st.sampled_from([5, None, ["cnn"], "no-such-workload"])),
    "workload_options": st.sampled_from(["fake", 5, ["data"], {"no_such_option": 1},
                                        {"data": "imagenet"}, {"train_subset": -3}]),
    "search_strategy": st.one_of(NOT_SEARCH_STRATEGIES, WRONG_TYPES),
    # its former names (deprecated): None is not given
    "strategy": st.one_of(NOT_SEARCH_STRATEGIES, WRONG_TYPES.filter(lambda v: v is not None)),
    "mode": st.one_of(NOT_SEARCH_STRATEGIES, WRONG_TYPES.filter(lambda v: v is not None)),
    "strategy_options": st.sampled_from(["fast", "rounds=3", 5, ["rounds"],
                                         {"no_such_option": 1}]),
    "measure_seconds": st.one_of(st.floats(max_value=-1e-9), st.just(float("nan")),
                                 st.just("2"), WRONG_TYPES),
    "address": st.sampled_from([5, 1.5, ["auto"], "", "   "]),
    "resources_per_worker": RESOURCES,
    "provision_timeout_s": TIMEOUTS,
    "resume": st.sampled_from(["yes", 1, 0, None, True]),  # True: without a name
    "training_strategy": st.one_of(st.text().filter(lambda t: t not in (
        "ags", "ags-ns", "lbt", "lrs", "lars", "polo")), st.sampled_from([5, ["ags"]])),
    "training_options": st.sampled_from(["fast", 5, ["delta"], {"no_such_option": 1}]),
    "runtime_env": RUNTIME_ENVS,
    "noise_scale": st.one_of(st.floats(max_value=0.0), st.sampled_from(
        [float("nan"), float("inf"), "300", [300], {"phi": 1}, 1.5j])),
    "verbose": VERBOSE_LEVELS_NOT,
}


@SETTINGS
@given(data=st.data())
def test_search_refuses_a_bad_argument_before_ray_starts(data):
    argument = data.draw(st.sampled_from(sorted(BAD_SEARCH)), label="argument")
    value = data.draw(BAD_SEARCH[argument], label="value")
    assert_refused(lambda: tula_ray.search(**{**GOOD_SEARCH, argument: value}), argument)


@SETTINGS
@given(name=st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True))
def test_search_refuses_an_unknown_argument(name):
    if name in BAD_SEARCH or name in GOOD_SEARCH:
        return
    assert_refused(lambda: tula_ray.search(**{**GOOD_SEARCH, name: 1}), name)


# --- train() ------------------------------------------------------------------------

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=256)


@pytest.fixture(scope="module")
def plan():
    return build_plan(SPACE, synthetic_profiles(SPACE.candidates(), example_params()),
                      epochs=2, dataset_size=1000, search_strategy="full", objective="time",
                      workload="fashion-mnist-cnn",
                      meta={"workload_options": {"data": "fake", "fake_size": 1000}})


BAD_TRAIN = {
    "verbose": VERBOSE_LEVELS_NOT,
    "strategy": st.one_of(st.text().filter(lambda t: t not in ("ags", "lbt", "lrs", "lars",
                                                                "polo")), WRONG_TYPES),
    "epochs": st.one_of(NON_POSITIVE_INTS, NOT_INTS.filter(lambda v: v is not None)),
    "seed": st.sampled_from([1.5, "0", None, True]),
    "lr": st.one_of(st.floats(max_value=0), st.just(float("nan")), st.just("0.1")),
    "max_failures": st.one_of(st.integers(max_value=-2), NOT_INTS),
    "strategy_options": st.sampled_from([{"no_such_option": 1}, "delta=0.5", 5,
                                         {"delta": -1.0}, {"delta": "calm"}]),
    "workload": st.sampled_from([5, ["cnn"], "no-such-workload"]),
    "workload_options": st.sampled_from(["fake", 5, {"no_such_option": 1}]),
    "storage_path": st.sampled_from([5, 1.5, ["runs"]]),
    "name": st.sampled_from([5, 1.5, ["run"], ""]),
    "use_gpu": st.sampled_from(["yes", 1.5, [True]]),
    "address": st.sampled_from([5, 1.5, ["auto"], ""]),
    "resources_per_worker": RESOURCES,
    "provision_timeout_s": TIMEOUTS,
    "runtime_env": RUNTIME_ENVS,
}


# --- tune_training() -------------------------------------------------------------------

BAD_TUNE = {
    "strategy": BAD_TRAIN["strategy"],
    "trials": st.one_of(NON_POSITIVE_INTS, NOT_INTS.filter(lambda v: v is not None)),
    "epochs": BAD_TRAIN["epochs"],
    "validation_fraction": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0),
                                     st.just(float("nan")), st.just("0.1")),
    "seed": BAD_TRAIN["seed"],
    "grace_period": st.one_of(NON_POSITIVE_INTS, st.just(1.5), st.just(10**6)),
    "storage_path": BAD_TRAIN["storage_path"],
    "name": BAD_TRAIN["name"],
    "use_gpu": BAD_TRAIN["use_gpu"],
    "address": BAD_TRAIN["address"],
    "workload": BAD_TRAIN["workload"],
    "workload_options": BAD_TRAIN["workload_options"],
    "runtime_env": RUNTIME_ENVS,
}


@pytest.mark.parametrize("entry, bad", [("train", BAD_TRAIN), ("tune_training", BAD_TUNE)])
@SETTINGS
@given(data=st.data())
def test_training_entry_points_refuse_a_bad_argument_before_ray_starts(plan, entry, bad, data):
    """train() and tune_training() take a plan and the same kind of arguments."""
    argument = data.draw(st.sampled_from(sorted(bad)), label="argument")
    value = data.draw(bad[argument], label="value")
    assert_refused(lambda: getattr(tula_ray, entry)(plan, **{argument: value}), argument)


# --- the YAML config of `tula-ray search` ----------------------------------------------

YAML_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.text(max_size=8),
                        st.lists(st.integers(-2, 4), max_size=3),
                        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@SETTINGS
@given(data=st.data())
def test_search_config_file_refuses_bad_values_with_the_key_named(tmp_path_factory, data):
    import yaml

    argument = data.draw(st.sampled_from(sorted(BAD_SEARCH)), label="argument")
    value = data.draw(YAML_VALUES.filter(lambda v: not _valid(argument, v)), label="value")
    config = tmp_path_factory.mktemp("config") / "search.yaml"
    config.write_text(yaml.safe_dump({**GOOD_SEARCH, "cluster_sizes": [1, 2], argument: value}))
    with ray_must_not_start(), mock.patch("sys.stderr") as stderr:
        assert main(["search", str(config)]) == 2
    printed = "".join(str(call.args[0]) for call in stderr.write.call_args_list)
    assert argument in printed, printed


def _valid(argument: str, value) -> bool:
    """Whether a YAML value is an allowed one (those are not this test's business)."""
    checks = {
        # A size above the cluster's capacity is refused by asking the cluster (Ray runs).
        "cluster_sizes": lambda v: isinstance(v, list) and v and all(
            isinstance(n, int) and not isinstance(n, bool) and 0 < n for n in v),
        "min_batch": lambda v: _positive_int(v) and v <= 256,
        "max_batch": lambda v: v is None or (_positive_int(v) and v >= 32),
        "objective": lambda v: v in ("time", "cost", "knee", "weighted"),
        "pricing": lambda v: v in ("fixed", "memory"),
        "weight_time": lambda v: _number(v) and 0 <= v <= 1,
        "device_memory_gb": lambda v: v is None or (_number(v) and v > 0),
        "headroom": lambda v: _number(v) and 0 <= v < 1,
        "collective": lambda v: v in ("ring", "ps"),
        "warmup_steps": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "measure_steps": _positive_int,
        "measure_seconds": lambda v: _number(v) and v >= 0,
        "search_strategy": lambda v: v in ("full", "partial", "adaptive"),
        "strategy": lambda v: v is None or v in ("full", "partial", "adaptive"),
        "mode": lambda v: v is None or v in ("full", "partial", "adaptive"),
        "strategy_options": lambda v: v is None or v == {},
        "storage_path": lambda v: v is None or (isinstance(v, str) and v != ""),
        "name": lambda v: v is None or (isinstance(v, str) and v != ""),
        "workload": lambda v: v in ("fashion-mnist-cnn",),
        "workload_options": lambda v: v is None or v == {} or v == {"data": "fake"},
        # A non-empty string is an address to join: only its connection can tell.
        "address": lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
        "resume": lambda v: v is False,  # True needs a name, which this config lacks
        "resources_per_worker": lambda v: v is None or (isinstance(v, dict) and bool(v) and all(
            isinstance(k, str) and k and _number(x) and x >= 1e-4
            and not (k == "GPU" and x > 1 and x != int(x)) for k, x in v.items())),
        "provision_timeout_s": lambda v: _number(v) and v >= 0,
        "training_strategy": lambda v: v is None or v in (
            "ags", "ags-ns", "lbt", "lrs", "lars", "polo"),
        "training_options": lambda v: v is None or v == {},
        "runtime_env": lambda v: v is None or v == {},
        "noise_scale": lambda v: v is None or (_number(v) and 0 < v < math.inf),
        "verbose": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2,
    }
    return bool(checks[argument](value))


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def test_train_refuses_a_workload_without_test_data(plan):
    """A search needs no test set; training scores one every epoch: refused before Ray."""
    import dataclasses

    from tula_ray.workloads import get_workload

    no_test = dataclasses.replace(get_workload("fashion-mnist-cnn", data="fake", fake_size=1000),
                                  test_dataset_fn=None)
    assert_refused(lambda: tula_ray.train(plan, workload=no_test), "test_dataset_fn")


def test_lars_with_a_workload_that_is_not_sgd_is_refused_before_ray_starts(plan):
    """Issue 41, item 1: LARS builds its own optimizer from an SGD's hyper-parameters; a
    workload with Adam is refused by search, train and tune_training, naming both."""
    import dataclasses

    import torch

    from tula_ray.workloads import get_workload

    adam = dataclasses.replace(get_workload("fashion-mnist-cnn", data="fake", fake_size=1000),
                               optimizer_fn=lambda params: torch.optim.Adam(params, lr=1e-3))
    calls = [lambda: tula_ray.search(**{**GOOD_SEARCH, "workload": adam, "workload_options": None,
                                        "training_strategy": "lars"}),
             lambda: tula_ray.train(plan, "lars", workload=adam),
             lambda: tula_ray.tune_training(plan, "lars", workload=adam)]
    for call in calls:
        assert_refused(call, "Adam")
        assert_refused(call, "lars")


def test_a_bad_host_allocator_setting_is_refused_before_ray_starts(plan, monkeypatch):
    """TULA_RAY_HOST_ALLOCATOR, in the driver's environment (a local Ray's workers inherit
    it) or in runtime_env's env_vars: search, train and tune_training refuse a value other
    than "steady" or "default", naming where it was set, before any worker could read it."""
    calls = [lambda **extra: tula_ray.search(**GOOD_SEARCH, **extra),
             lambda **extra: tula_ray.train(plan, **extra),
             lambda **extra: tula_ray.tune_training(plan, **extra)]
    monkeypatch.setenv("TULA_RAY_HOST_ALLOCATOR", "off")
    for call in calls:
        assert_refused(call, "TULA_RAY_HOST_ALLOCATOR='off' (in this process's environment)")
    monkeypatch.setenv("TULA_RAY_HOST_ALLOCATOR", "default")
    bad = {"env_vars": {"TULA_RAY_HOST_ALLOCATOR": "fast"}}
    for call in calls:
        assert_refused(lambda: call(runtime_env=bad),
                       "TULA_RAY_HOST_ALLOCATOR='fast' (in runtime_env's env_vars)")
