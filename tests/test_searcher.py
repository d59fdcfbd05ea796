"""TulaSearcher logic, driven by hand (no Ray session)."""

import json

import pytest
from ray.tune.search import Searcher

from searchers import TulaSearcher
from tula_ray.space import SearchSpace

SPACE = SearchSpace.build((1, 2, 4), min_batch=32, max_batch=256)


def ok_row(config, step=0.1):
    return {"status": "ok", "step_time_s": step, "compute_time_s": step, "sync_time_s": 0.0,
            "num_workers": config["num_workers"], "global_batch": config["global_batch"],
            "local_batch": config["global_batch"] // config["num_workers"], "error": ""}


def run(searcher, outcome=lambda config: ok_row(config)):
    """Tune's loop with one trial at a time: suggest, run, complete."""
    suggested = []
    for i in range(100):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            return suggested
        assert config is not None
        suggested.append((config["num_workers"], config["global_batch"]))
        searcher.on_trial_complete(f"t{i}", outcome(config))
    raise AssertionError("searcher never finished")


def test_full_search_suggests_every_candidate_once():
    suggested = run(TulaSearcher(SPACE.candidates(), "full"))
    assert sorted(suggested) == sorted((c.num_workers, c.global_batch) for c in SPACE.candidates())


def test_partial_search_suggests_the_corners():
    suggested = run(TulaSearcher(SPACE.candidates(), "partial"))
    assert sorted(suggested) == [(1, 32), (1, 256), (4, 32), (4, 256)]


def test_suggestions_hold_the_searched_keys_only_and_the_state_is_json():
    """What trials share (the user's Workload, steps) comes from the Tuner's param_space,
    which Tune merges into each suggestion: the searcher never holds it."""
    searcher = TulaSearcher(SPACE.candidates(), "partial")
    assert set(searcher.suggest("a")) == {"num_workers", "global_batch"}
    json.dumps(searcher.get_state())


def test_oom_lowers_the_bound_and_partial_falls_back_inward():
    def outcome(config):
        row = ok_row(config)
        if row["local_batch"] >= 128:
            row.update(status="oom", step_time_s=None)
        return row

    searcher = TulaSearcher(SPACE.candidates(), "partial")
    suggested = run(searcher, outcome)
    # (1, 256) runs out of memory at b = 256; (1, 128) too; (1, 64) is the new corner.
    assert (1, 256) in suggested and (1, 128) in suggested and (1, 64) in suggested
    assert (4, 256) in suggested  # b = 64 fits
    assert searcher.oom_local_batch == 128
    ok = {(r["num_workers"], r["global_batch"]) for r in searcher.profiles if r["status"] == "ok"}
    assert {(1, 32), (1, 64), (4, 32), (4, 256)} <= ok


def test_full_search_skips_candidates_above_the_oom_bound():
    def outcome(config):
        row = ok_row(config)
        if row["local_batch"] >= 64:
            row.update(status="oom", step_time_s=None)
        return row

    suggested = run(TulaSearcher(SPACE.candidates(), "full"), outcome)
    assert (1, 128) not in suggested and (1, 256) not in suggested  # b >= 64 never tried
    assert (4, 128) in suggested  # b = 32


def test_crashed_candidate_is_recorded_not_fatal():
    searcher = TulaSearcher(SPACE.candidates(), "partial")
    config = searcher.suggest("a")
    searcher.on_trial_complete("a", None, error=True)
    row = searcher.profiles[0]
    assert row["status"] == "error"
    assert (row["num_workers"], row["global_batch"]) == (config["num_workers"], config["global_batch"])
    assert run(searcher)  # the search goes on, with a fallback for the crashed corner


def test_save_and_restore_resume_without_repeating_finished_candidates(tmp_path):
    first = TulaSearcher(SPACE.candidates(), "full")
    done = []
    for i in range(3):
        config = first.suggest(f"t{i}")
        done.append((config["num_workers"], config["global_batch"]))
        first.on_trial_complete(f"t{i}", ok_row(config))
    interrupted = first.suggest("t3")  # running when the search stops
    first.save(str(tmp_path / "searcher.json"))

    resumed = TulaSearcher(SPACE.candidates()[:1], "partial")  # state comes from the file
    resumed.restore(str(tmp_path / "searcher.json"))
    rest = run(resumed)
    assert not set(done) & set(rest)
    assert (interrupted["num_workers"], interrupted["global_batch"]) in rest
    assert len(resumed.profiles) == len(SPACE.candidates())


def test_bad_search_mode():
    with pytest.raises(ValueError, match="search_mode 'half' is not allowed"):
        TulaSearcher(SPACE.candidates(), "half")
