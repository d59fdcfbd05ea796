"""ray-floor's verdict (issue 40, item 4), from runs made by hand: no demo, no Ray."""

import pytest

from benchmarks.startup import ray_floor


def _floor(index: int, wall_s: float) -> dict:
    parts = {"imports_s": 3.0, "ray_start_s": 5.0, "tune_s": wall_s - 11.0,
             "ray_end_s": 1.5, "other_s": 1.5}
    return {"tree": "this", "index": index, "wall_s": wall_s, **parts}


def _baseline(index: int, outside_s: float) -> dict:
    return {"tree": "baseline", "index": index, "outside_s": outside_s,
            "wall_s": outside_s + 10.0}


def _report(runs: list[dict], quick: bool = False) -> str:
    result = {"provenance": {"command": "-", "commit": "-", "date": "-", "machine": "-"},
              "commits": {"this": "abc", "baseline": "03a9521"}, "quick": quick,
              "runs": runs, **ray_floor.summary(runs)}
    return ray_floor.report(result)


def test_a_floor_above_half_the_baselines_outside_time_puts_the_goal_out_of_reach():
    runs = [_floor(0, 33.0), _baseline(0, 58.0), _floor(1, 31.0), _baseline(1, 56.0),
            _floor(2, 40.0), _baseline(2, 57.0)]
    summary = ray_floor.summary(runs)
    assert summary["floor"]["wall_s"] == {"median": 33.0, "min": 31.0, "max": 40.0}
    assert summary["floor_ratio"] == pytest.approx(33.0 / 57.0)
    assert summary["goal_reachable"] is False
    text = _report(runs)
    assert "| floor: wall | 33.0 [31.0, 40.0] |" in text
    assert "| baseline demo (03a9521): outside | 57.0 [56.0, 58.0] |" in text
    assert "0.58; the goal allows 0.5 (28.5 s): out of reach" in text


def test_a_floor_under_half_leaves_the_goal_to_tula_rays_own_steps():
    runs = [_floor(0, 25.0), _baseline(0, 58.0)]
    assert ray_floor.summary(runs)["goal_reachable"] is True
    assert "reachable, as far as Ray's part goes." in _report(runs)


def test_a_quick_run_has_no_baseline_and_no_verdict():
    text = _report([_floor(0, 21.0)], quick=True)
    assert "N in {1}, each worker function making only 1 report(s)" in text
    assert "baseline demo" not in text and "goal allows" not in text
