"""TulaSearcher (the Tune adapter) and the search strategies, driven by hand (no Ray session)."""

import json
import math

import pytest
from ray.tune.search import Searcher

from searchers import TulaSearcher
from tula_ray.planning import search_strategies
from tula_ray.profile_table import LAUNCH_TOTAL_KEY, profile_frame
from tula_ray.planning.search_strategies import SEARCH_STRATEGIES, Proposal, make_search_strategy, register_search_strategy
from tula_ray.space import Candidate, SearchSpace, corners

SPACE = SearchSpace.build((1, 2, 4), min_batch=32, max_batch=256)


def ok_row(n, b, step=0.1):
    return {"status": "ok", "step_time_s": step, "compute_time_s": step, "sync_time_s": 0.0,
            "num_workers": n, "global_batch": b, "local_batch": b // n, "error": ""}


def run(searcher, outcome=lambda n, b: ok_row(n, b), stop_after=None):
    """Tune's loop with one trial at a time: suggest, one result per batch in order (a sweep
    ends at its first OOM, as the worker loop does), complete. Returns the trials' configs."""
    trials = []
    for i in range(100):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            return trials
        assert config is not None and set(config) == {"num_workers", "global_batches", "round"}
        trials.append(config)
        if stop_after is not None and len(trials) > stop_after:
            return trials  # the driver dies with this trial running
        n = config["num_workers"]
        for b in config["global_batches"]:
            row = outcome(n, b)
            searcher.on_trial_result(f"t{i}", row)
            if row["status"] == "oom":
                break
        searcher.on_trial_complete(f"t{i}", row)
    raise AssertionError("searcher never finished")


def pairs(trials):
    return sorted((t["num_workers"], b) for t in trials for b in t["global_batches"])


def test_full_search_launches_once_per_cluster_size():
    searcher = TulaSearcher(SPACE.candidates(), "full")
    trials = run(searcher)
    assert [t["num_workers"] for t in trials] == [1, 2, 4]  # one worker group per N
    assert pairs(trials) == sorted((c.num_workers, c.global_batch) for c in SPACE.candidates())
    assert all(t["global_batches"] == sorted(t["global_batches"]) for t in trials)
    assert len(searcher.sweeps) == 3 and searcher.rounds == 1
    assert "every feasible candidate is profiled" in searcher.stop_reason


def test_partial_search_profiles_the_corners_and_middles_in_two_launches():
    trials = run(TulaSearcher(SPACE.candidates(), "partial"))
    # B = 32 ... 256: the middle is 64 or 128, equally near sqrt(32 * 256); the smaller
    assert [(t["num_workers"], t["global_batches"]) for t in trials] == [
        (1, [32, 64, 256]), (4, [32, 64, 256])]


def test_the_papers_partial_search_profiles_the_corners_only():
    trials = run(TulaSearcher(SPACE.candidates(), "partial", {"middle": False}))
    assert [(t["num_workers"], t["global_batches"]) for t in trials] == [
        (1, [32, 256]), (4, [32, 256])]
    with pytest.raises(ValueError, match="middle"):
        make_search_strategy("partial", {"middle": "yes"})


def test_suggestions_hold_the_searched_keys_only_and_the_state_is_json():
    """What trials share (the user's Workload, steps) comes from the Tuner's param_space,
    which Tune merges into each suggestion: the searcher never holds it."""
    searcher = TulaSearcher(SPACE.candidates(), "partial")
    assert set(searcher.suggest("a")) == {"num_workers", "global_batches", "round"}
    json.dumps(searcher.get_state())


def oom_from(local_batch):
    def outcome(n, b):
        row = ok_row(n, b)
        if b // n >= local_batch:
            row.update(status="oom", step_time_s=None)
        return row
    return outcome


PAPER_PARTIAL = {"middle": False}  # the corners alone: where a test is about them


def test_oom_ends_the_sweep_and_partial_falls_back_inward():
    searcher = TulaSearcher(SPACE.candidates(), "partial", PAPER_PARTIAL)
    trials = run(searcher, oom_from(128))
    # N=1 runs 32 then 256 (OOM at b=256); N=4's b=64 fits. Then the next batch inward
    # at N=1, one relaunch each (paper §IV-B): 128 (OOM), then 64.
    assert [(t["round"], t["num_workers"], t["global_batches"]) for t in trials] == [
        (1, 1, [32, 256]), (1, 4, [32, 256]), (2, 1, [128]), (3, 1, [64])]
    ok = {(r["num_workers"], r["global_batch"]) for r in searcher.profiles if r["status"] == "ok"}
    assert {(1, 32), (1, 64), (4, 32), (4, 256)} <= ok


def test_full_search_drops_batches_an_earlier_sweep_found_too_large():
    trials = run(TulaSearcher(SPACE.candidates(), "full"), oom_from(64))
    sweeps = {t["num_workers"]: t["global_batches"] for t in trials}
    assert sweeps[1] == [32, 64, 128, 256]  # OOM at 64: 128 and 256 never run
    assert sweeps[2] == [32, 64]  # b = 16, 32 only: b >= 64 is known not to fit
    assert sweeps[4] == [32, 64, 128]


def test_a_crashed_worker_group_is_recorded_not_fatal():
    searcher = TulaSearcher(SPACE.candidates(), "partial", PAPER_PARTIAL)
    config = searcher.suggest("a")
    searcher.on_trial_result("a", ok_row(1, 32))
    searcher.on_trial_complete("a", None, error=True)  # died before B = 256
    rows = {(r["num_workers"], r["global_batch"]): r for r in searcher.profiles}
    assert rows[(1, 32)]["status"] == "ok" and rows[(1, 256)]["status"] == "error"
    assert config["global_batches"] == [32, 256]
    rest = run(searcher)  # the search goes on: N=4, then N=1's next batch inward
    assert (1, 128) in pairs(rest)


def test_a_failed_group_re_reporting_every_batch_keeps_the_measured_ones():
    searcher = TulaSearcher(SPACE.candidates(), "partial", PAPER_PARTIAL)
    searcher.suggest("a")
    searcher.on_trial_result("a", ok_row(1, 32))
    for b in (32, 256):  # the trial's failure path reports every batch as an error
        searcher.on_trial_result("a", {**ok_row(1, b), "status": "error", "error": "boom"})
    searcher.on_trial_complete("a", None)
    rows = {r["global_batch"]: r["status"] for r in searcher.profiles}
    assert rows == {32: "ok", 256: "error"}


def test_a_launchs_time_beyond_its_candidates_goes_on_its_rows():
    """The trial reports its whole launch after its worker group ends (no candidate, the
    metric NaN): each of its rows gets the launch less the candidates' own time, what a
    `train` job waits for beyond its epochs; a row of an earlier round keeps its own."""
    searcher = TulaSearcher(SPACE.candidates(), "partial", PAPER_PARTIAL)
    config = searcher.suggest("a")
    assert config["global_batches"] == [32, 256]
    for b, seconds in ((32, 2.0), (256, 5.0)):
        searcher.on_trial_result("a", {**ok_row(1, b), "round": 1, "profile_wall_s": seconds})
    searcher.on_trial_complete("a", {LAUNCH_TOTAL_KEY: 30.0, "step_time_s": math.nan})
    rows = {r["global_batch"]: r for r in searcher.profiles if r["num_workers"] == 1}
    assert rows[32]["launch_fixed_s"] == rows[256]["launch_fixed_s"] == pytest.approx(23.0)
    assert len(searcher.sweeps) == 1  # the launch's record is no candidate's row
    assert profile_frame(searcher.profiles)["launch_fixed_s"].notna().sum() == 2


def test_save_and_restore_resume_without_repeating_finished_candidates(tmp_path):
    first = TulaSearcher(SPACE.candidates(), "full")
    done = pairs(run(first, stop_after=1)[:1])  # N=1 finished; N=2 was running
    first.on_trial_result("t1", ok_row(2, 32))  # one batch of the running group measured
    first.save(str(tmp_path / "searcher.json"))

    resumed = TulaSearcher(SPACE.candidates()[:1], "partial")  # state comes from the file
    resumed.restore(str(tmp_path / "searcher.json"))
    rest = run(resumed)
    assert not set(done) & set(pairs(rest))
    assert (2, 32) not in pairs(rest) and (2, 64) in pairs(rest)
    assert len(resumed.profiles) == len(SPACE.candidates())


def test_a_searcher_saved_with_an_experiment_is_rebuilt_from_its_state_alone(tmp_path):
    """`TulaSearcher.from_experiment`: what a resumed search reads (Tune's file of the
    searcher in the experiment's directory), nothing from a constructor's arguments."""
    first = TulaSearcher(SPACE.candidates(), "full", resume_record={"request": {"name": "x"}})
    done = pairs(run(first, stop_after=1)[:1])
    first.save_to_dir(str(tmp_path), session_str="s")
    resumed = TulaSearcher.from_experiment(str(tmp_path))
    measured = [(row["num_workers"], row["global_batch"]) for row in first.profiles]
    assert [(row["num_workers"], row["global_batch"]) for row in resumed.profiles] == measured
    assert resumed.rounds == first.rounds
    assert resumed.resume_record == {"request": {"name": "x"}}
    assert not set(done) & set(pairs(run(resumed)))
    with pytest.raises((FileNotFoundError, RuntimeError)):
        TulaSearcher.from_experiment(str(tmp_path / "nothing-saved"))


def test_unknown_strategy_names_the_known_ones():
    with pytest.raises(ValueError, match=r"search strategy 'half' is unknown; use one of "
                                         r"\['adaptive', 'full', 'partial'"):
        TulaSearcher(SPACE.candidates(), "half")
    with pytest.raises(ValueError, match="strategy_options=.* do not fit search strategy 'full'"):
        make_search_strategy("full", {"rounds": 3})


class DiagonalSearch:
    """A fourth strategy, as a user adds one: the (N_min, B_min) and (N_max, B_max) corners."""

    name = "diagonal"

    def propose(self, grid, rows):
        todo = search_strategies.open_candidates([grid[0], grid[-1]], rows)
        return Proposal(tuple(todo), "diagonal" if todo else "diagonal done")

    def fit_rows(self, rows):
        return rows


@pytest.fixture
def diagonal():
    register_search_strategy("diagonal", DiagonalSearch)
    try:
        yield
    finally:
        SEARCH_STRATEGIES.pop("diagonal")


def test_a_fourth_strategy_is_one_registration(diagonal):
    searcher = TulaSearcher(SPACE.candidates(), "diagonal")
    trials = run(searcher)
    assert pairs(trials) == [(1, 32), (4, 256)] and searcher.stop_reason == "diagonal done"


def test_partial_fit_rows_are_the_corners_of_what_was_measured():
    rows = profile_frame([ok_row(n, b) for n in (1, 2, 4) for b in (32, 64, 128)]
                         + [{**ok_row(1, 256), "status": "oom", "step_time_s": None}])
    fitted = make_search_strategy("partial", PAPER_PARTIAL).fit_rows(rows)
    assert sorted(zip(fitted["num_workers"], fitted["global_batch"])) == [
        (1, 32), (1, 128), (4, 32), (4, 128)]
    fitted = make_search_strategy("partial").fit_rows(rows)  # and the middle at those N
    assert sorted(zip(fitted["num_workers"], fitted["global_batch"])) == [
        (1, 32), (1, 64), (1, 128), (4, 32), (4, 64), (4, 128)]
    assert corners(SPACE.candidates()) == [Candidate(1, 32), Candidate(1, 256), Candidate(4, 32),
                                Candidate(4, 256)]


# --- adaptive search (issue 11, item 3) -------------------------------------------------

GRID = SearchSpace.build((1, 2, 4), min_batch=32, max_batch=1024)
EPOCHS, DATASET = 2, 8192


def paper_step_s(n, b):
    """Ground truth from the paper's equations, written here: eq. 2b compute = a + c b
    (b = B / N), eq. 2c ring sync = s (1 - 1/N), eq. 2a step = compute + sync."""
    compute = 0.05 + 3e-4 * (b // n)  # a large fixed cost per step: a marked knee in B
    return compute, 0.05 * (1 - 1 / n)


def paper_row(n, b, spread=0.02):
    compute, sync = paper_step_s(n, b)
    return {**ok_row(n, b, compute + sync), "compute_time_s": compute, "sync_time_s": sync,
            "step_time_spread": spread, "launch_wall_s": 10.0, "profile_wall_s": 1.0,
            "peak_mem_bytes": 1e7 + 1e4 * (b // n)}


def adaptive(**options):
    # The knee: on the paper's linear model the fastest and the cheapest candidates are
    # corners (T falls with B; sync and compute trade evenly in N), the knee is inside.
    return TulaSearcher(GRID.candidates(), "adaptive",
                        dict(objective="knee", epochs=EPOCHS, dataset_size=DATASET, **options))


def with_round(searcher, outcome):
    """Rows carry the round that asked for them, as the worker loop reports it."""
    def rows(n, b):
        return {**outcome(n, b), "round": searcher.rounds}
    return rows


def test_adaptive_search_measures_its_choice_and_stops_when_nothing_ties_it():
    searcher = adaptive()
    trials = run(searcher, with_round(searcher, paper_row))
    assert trials[0]["round"] == 1 and pairs(trials[:2]) == [
        (1, 32), (1, 128), (1, 1024), (4, 32), (4, 128), (4, 1024)]  # partial's, middles too
    profiled = set(pairs(trials))
    assert searcher.rounds >= 2 and len(profiled) < len(GRID.candidates())  # not the whole grid
    assert "is measured and no unmeasured candidate ties it" in searcher.stop_reason
    chosen = searcher.stop_reason.split("the choice N=")[1].split(" is measured")[0]
    n, b = (int(part.split("=")[-1]) for part in chosen.split(", "))
    assert (n, b) in profiled  # the plan's choice is a measured candidate


def test_adaptive_search_stops_when_its_budget_is_spent():
    searcher = adaptive(max_rounds=1, middle=False)  # the corners alone: the knee unmeasured
    trials = run(searcher, with_round(searcher, paper_row))
    assert {t["round"] for t in trials} == {1}
    assert "budget spent after 1 rounds (max_rounds=1)" in searcher.stop_reason
    assert "is predicted, not measured" in searcher.stop_reason  # the knee is inside the grid


def test_adaptive_options_are_checked():
    with pytest.raises(ValueError, match="max_rounds=0"):
        make_search_strategy("adaptive", {"max_rounds": 0})


def test_adaptive_search_never_chases_what_the_training_strategy_refuses():
    """The final plan never chooses a candidate the training strategy refuses, so no round
    profiles one for the choice: free, the knee is N = 1, B = 128; with B = 64 ... 512
    refused at every N, no round after partial's first profiles one of them, and the
    choice is a candidate `train` can train."""
    free = adaptive()
    run(free, with_round(free, paper_row))
    assert "the choice N=1, B=128 is measured" in free.stop_reason
    refused = [[n, b, "refused"] for n in (1, 2, 4) for b in (64, 128, 256, 512)]
    searcher = adaptive(untrainable=refused)
    trials = run(searcher, with_round(searcher, paper_row))
    later = {(t["num_workers"], b) for t in trials if t["round"] > 1
             for b in t["global_batches"]}
    assert not later & {(n, b) for n, b, _ in refused}
    assert "the choice N=1, B=32 is measured" in searcher.stop_reason


def test_search_gives_the_adaptive_search_the_training_strategys_limits():
    """What the final plan is built with (refused candidates, plain SGD steps, the user's
    noise scale) reaches the adaptive search's own plans, as JSON (its state is saved as
    such)."""
    from types import SimpleNamespace

    from tula_ray.models.pricing import parse_pricing
    from tula_ray.runs.search import _plan_context, _strategy_options

    space = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
    request = SimpleNamespace(
        search_strategy="adaptive", strategy_options={}, objective="time_to_accuracy", epochs=2,
        workload=SimpleNamespace(dataset_size=8192, name="custom", eval_batch=None),
        pricing=parse_pricing("fixed"),
        weight_time=0.5, collective="ring", reference_batch=64, noise_scale=250.0,
        training_strategy="ags", training_options={"small_batch": 64})
    probe = SimpleNamespace(params=None, max_local_batch=256)
    context = _plan_context(request, space, probe, workers_per_node=None)
    options = _strategy_options(request, context)
    json.dumps(options)
    assert [tuple(p[:2]) for p in options["plan_context"]["untrainable"]] == [(2, 128)]
    assert options["plan_context"]["plain_steps"] == [[1, 32], [1, 64], [2, 32], [2, 64]]
    strategy = make_search_strategy("adaptive", options)
    assert set(strategy.context.refused) == {(2, 128)}
    assert strategy.context.plain_steps == {(1, 32), (1, 64), (2, 32), (2, 64)}
    assert strategy.context.noise_scale == 250.0  # the user's phi plans its rounds too
    # train evaluates at the local batch of a workload without eval_batch: the plan knows
    assert strategy.context.eval_at_local_batch
    request.workload.eval_batch = 500
    assert not _plan_context(request, space, probe, workers_per_node=None).eval_at_local_batch
