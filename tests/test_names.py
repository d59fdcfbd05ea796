"""The search strategy's one name (issue 42, step 5): `search_strategy` on `search`,
`build_plan` and `Plan`, `--search-strategy` on the command line. The former names
(`strategy=`, `mode=`, `Plan.strategy`, `--mode`) still work, each with a FutureWarning that
names its removal version; two names at once are refused; recorded plans still load."""

import json
from pathlib import Path

import pytest
from paper_profiles import paper_profiles
from test_bad_input import ray_must_not_start

import tula_ray
from tula_ray.cli.command import build_parser
from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import FORMER_NAMES_REMOVED_IN, Plan, build_plan
from tula_ray.planning.synthetic import example_params
from tula_ray.space import SearchSpace, corners

SPACE = SearchSpace.build((1, 2, 4), min_batch=32, max_batch=1024)
PROFILES = paper_profiles(corners(SPACE.candidates()), example_params(), seed=2)
CONTEXT = PlanContext(epochs=5, dataset_size=10000)
RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"
REMOVED = rf"removed in tula-ray {FORMER_NAMES_REMOVED_IN}"


@pytest.mark.parametrize("former", ["strategy", "mode"])
def test_build_plans_former_names_warn_and_build_the_same_plan(former):
    with pytest.warns(FutureWarning, match=rf"`{former}=` is deprecated.*{REMOVED}.*"
                                           "search_strategy="):
        old = build_plan(SPACE, PROFILES, CONTEXT, **{former: "full"})
    new = build_plan(SPACE, PROFILES, CONTEXT, search_strategy="full")
    assert old.search_strategy == new.search_strategy == "full"
    assert old.to_json() == new.to_json()


def test_two_names_of_the_search_strategy_are_refused():
    with pytest.raises(TypeError, match="search_strategy='full', strategy='partial' all name "
                                        "the search strategy: pass search_strategy= alone"):
        build_plan(SPACE, PROFILES, CONTEXT, search_strategy="full", strategy="partial")
    with pytest.raises(TypeError, match="strategy='full', mode='full'"):
        build_plan(SPACE, PROFILES, CONTEXT, strategy="full", mode="full")


def test_plans_former_strategy_attribute_warns():
    plan = build_plan(SPACE, PROFILES, CONTEXT, search_strategy="full")
    with pytest.warns(FutureWarning, match=rf"Plan.strategy is deprecated.*{REMOVED}"):
        assert plan.strategy == "full"


def test_a_plan_keeps_its_json_key_and_recorded_plans_load():
    """The JSON keeps its key ("strategy", format 1): plans written before and after read
    alike, and one older still ("mode") too."""
    plan = build_plan(SPACE, PROFILES, CONTEXT, search_strategy="full")
    data = json.loads(plan.to_json())
    assert data["strategy"] == "full" and "search_strategy" not in data
    data["mode"] = data.pop("strategy")
    assert Plan.from_json(json.dumps(data)).search_strategy == "full"
    recorded = sorted(RESULTS.glob("*.plan*.json"))
    assert recorded
    for path in recorded:
        assert Plan.from_json(path).search_strategy in ("full", "partial", "adaptive"), path


@pytest.mark.parametrize("former", ["strategy", "mode"])
def test_searchs_former_names_warn_before_ray_starts(former):
    """The warning comes before anything starts: an unknown workload then stops it."""
    with ray_must_not_start(), pytest.raises(ValueError, match="no-such-workload"), \
            pytest.warns(FutureWarning, match=rf"`{former}=` is deprecated.*{REMOVED}"):
        tula_ray.search("no-such-workload", **{former: "full"})
    with ray_must_not_start(), pytest.raises(TypeError, match="pass search_strategy= alone"):
        tula_ray.search(search_strategy="full", **{former: "partial"})


def test_the_commands_former_mode_option_warns():
    parser = build_parser()
    assert parser.parse_args(["replay", "--synthetic"]).search_strategy == "partial"
    with pytest.warns(FutureWarning, match=rf"--mode is deprecated.*{REMOVED}: use "
                                           "--search-strategy"):
        args = parser.parse_args(["replay", "--synthetic", "--mode", "full"])
    assert args.search_strategy == "full"
