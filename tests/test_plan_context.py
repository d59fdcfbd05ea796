"""One PlanContext (issue 42, step 1): what a plan needs beyond its rows, checked once, its
defaults those of every entry point that plans, one JSON object to the searcher, recorded
by the plan; build_plan's former keywords and a search saved before it still work."""

import inspect
import json
from dataclasses import fields

import pytest
from paper_profiles import paper_profiles

from benchmarks.prediction import replay as benchmark_replay
from searchers import TulaSearcher
from tula_ray.cli.command import build_parser
from tula_ray.models.pricing import FixedRate
from tula_ray.planning.adaptive_search import AdaptiveSearch
from tula_ray.planning.context import PlanContext, context_defaults
from tula_ray.planning.plan import KEYWORDS_REMOVED_IN, Plan, build_plan
from tula_ray.planning.search_strategies import make_search_strategy
from tula_ray.planning.synthetic import example_params
from tula_ray.runs.search import search
from tula_ray.space import SearchSpace, corners

SPACE = SearchSpace.build((1, 2, 4), min_batch=32, max_batch=1024)
PROFILES = paper_profiles(corners(SPACE.candidates()), example_params(), seed=2)
# An adaptive search's strategy_options as a search saved them before PlanContext
# (tula_ray.runs.search._strategy_options at b6771ec, AGS with small_batch=64): the
# context as 12 keywords of the strategy's own, beside the corners' workers_per_node.
SAVED_BEFORE_PLAN_CONTEXT = {
    "max_rounds": 3, "workers_per_node": 2, "objective": "knee", "epochs": 3,
    "dataset_size": 10000,
    "pricing": {"kind": "fixed", "usd_per_node_hour": 3.0, "shared_nodes": False},
    "weight_time": 0.5, "collective": "ring",
    "memory": {"static_bytes": 0.0, "overhead_bytes": 102477931.90416141,
               "activation_bytes_per_sample": 770018.9155107184, "batch_bytes_per_sample": 0.0},
    "max_local_batch": 256, "reference_batch": 32, "noise_scale": None,
    "untrainable": [[2, 128, "ags: b = 64 needs small_batch < 64"],
                    [4, 128, "ags: b = 32 needs small_batch < 32"],
                    [4, 256, "ags: b = 64 needs small_batch < 64"]],
    "plain_steps": [[1, 32], [1, 64], [2, 32], [2, 64], [4, 32], [4, 64]]}


def defaults_of(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("function", [search, build_plan, AdaptiveSearch,
                                      benchmark_replay.replay], ids=lambda f: f.__name__)
def test_every_entry_point_defaults_to_the_contexts_defaults(function):
    # search()'s workload is what to train (a built-in's name), not the plan's label
    shared = {name: default for name, default in defaults_of(function).items()
              if name in context_defaults() and name != "workload"}
    assert shared == {name: context_defaults()[name] for name in shared}
    if function is search:  # the values a user gives search() of the context
        assert set(shared) >= {"objective", "pricing", "weight_time", "collective",
                               "reference_batch", "noise_scale"}


def test_the_adaptive_search_and_replay_take_a_plan_context():
    assert "plan_context" in inspect.signature(AdaptiveSearch).parameters
    assert "context" in inspect.signature(benchmark_replay.replay).parameters
    built = AdaptiveSearch().context  # built to say which rows to fit: the defaults
    assert {name: getattr(built, name) for name in context_defaults()} == {
        **context_defaults(), "pricing": FixedRate()}


def test_the_commands_defaults_are_the_contexts():
    replay = build_parser()._subparsers._group_actions[0].choices["replay"]
    defaults = {action.dest: action.default for action in replay._actions}
    assert defaults["objective"] == context_defaults()["objective"]
    assert defaults["pricing"] == context_defaults()["pricing"]
    assert defaults["reference_batch"] == context_defaults()["reference_batch"]
    assert defaults["noise_scale"] == context_defaults()["noise_scale"]


@pytest.mark.parametrize("name, bad", [
    ("epochs", 0), ("dataset_size", -1), ("reference_batch", 1.5), ("objective", "fast"),
    ("weight_time", 1.5), ("collective", "tree"), ("form", "cubic"), ("max_local_batch", 0),
    ("max_workers", "4"), ("max_global_batch", 0), ("workers_per_node", 0),
    ("noise_scale", float("nan")), ("noise_calibration", 0), ("workload", 3)])
def test_each_value_is_checked_when_built_and_named(name, bad):
    with pytest.raises((TypeError, ValueError), match=name):
        PlanContext(**{"epochs": 2, "dataset_size": 1000, name: bad})


def test_a_bad_pricing_is_refused_when_built():
    with pytest.raises(ValueError, match="pricing 'hourly'"):
        PlanContext(epochs=2, dataset_size=1000, pricing="hourly")


def test_the_context_goes_to_json_and_back_and_the_plan_records_it():
    context = PlanContext(epochs=3, dataset_size=10000, pricing="fixed:3.0",
                          untrainable={(2, 128): "refused"}, plain_steps=[(1, 32)],
                          noise_scale=250, workers_per_node=2)
    data = json.loads(json.dumps(context.to_dict(), allow_nan=False))
    assert PlanContext.from_dict(data) == context
    plan = build_plan(SPACE, PROFILES, context, search_strategy="partial")
    assert PlanContext.from_dict(Plan.from_json(plan.to_json()).meta["plan_context"]) == context


def test_build_plans_former_keywords_warn_and_build_the_same_plan():
    context = PlanContext(epochs=5, dataset_size=10000, objective="cost", pricing="memory")
    with pytest.warns(FutureWarning, match=f"keywords.*removed in tula-ray "
                                           f"{KEYWORDS_REMOVED_IN}.*PlanContext"):
        old = build_plan(SPACE, PROFILES, epochs=5, dataset_size=10000, objective="cost",
                         pricing="memory", search_strategy="partial")
    new = build_plan(SPACE, PROFILES, context, search_strategy="partial")
    assert old.choice == new.choice and old.meta == new.meta
    assert old.table.equals(new.table)


def test_build_plan_takes_the_context_or_its_keywords_not_both():
    context = PlanContext(epochs=5, dataset_size=10000)
    with pytest.raises(TypeError, match="not both"):
        build_plan(SPACE, PROFILES, context, objective="time")
    with pytest.raises(TypeError, match="context=PlanContext"):
        build_plan(SPACE, PROFILES)


def test_an_adaptive_search_saved_before_plan_context_restores_as_it_was():
    """The saved keywords become the same context as today's plan_context; both propose the
    same rounds; a TulaSearcher's saved state with them restores."""
    saved = dict(SAVED_BEFORE_PLAN_CONTEXT)
    old = make_search_strategy("adaptive", saved)
    context_keys = {f.name for f in fields(PlanContext)}
    new_options = {"max_rounds": 3, "workers_per_node": 2, "plan_context": PlanContext(
        **{k: v for k, v in saved.items() if k in context_keys}).to_dict()}
    new = make_search_strategy("adaptive", json.loads(json.dumps(new_options)))
    assert old.context == new.context and old.context.workers_per_node == 2
    assert old.context.refused[2, 128].startswith("ags") and old.context.max_local_batch == 256
    grid = [c for c in SPACE.candidates() if c.local_batch <= 256]
    rows = paper_profiles(corners(grid, 2), example_params(), seed=2).assign(
        round=1, launch_wall_s=1.0, profile_wall_s=1.0)
    assert old.propose(grid, rows) == new.propose(grid, rows)

    searcher = TulaSearcher(grid, "adaptive", new_options)
    state = json.loads(json.dumps({**searcher.get_state(), "strategy_options": saved}))
    searcher.set_state(state)
    assert searcher._strategy.context == new.context


def test_an_unknown_adaptive_option_is_refused_by_name():
    with pytest.raises(ValueError, match="objectiv"):
        make_search_strategy("adaptive", {"objectiv": "knee"})
