"""demo-startup's report of runs that chose differently (issue 40, item 5), from runs made
by hand: no demo, no Ray."""

from benchmarks.startup import demo_startup


def _run(index: int, choice: list[int], steps: dict[str, float] | None) -> dict:
    row = {"tree": "this", "index": index, "choice": choice, "ties": [], "tie_break": ""}
    return row if steps is None else {**row, "step_ms": steps}


def _report(runs: list[dict]) -> str:
    result = {"provenance": {"command": "-", "commit": "-", "date": "-", "machine": "-"},
              "commits": {"this": "abc"}, "outside_ratio": None,
              "medians": {"this": {part: 1.0 for part in (*demo_startup.PARTS, "outside_s",
                                                          "wall_s")}},
              "choices": [r["choice"] for r in runs],
              "same_choice": len({tuple(r["choice"]) for r in runs}) == 1, "runs": runs}
    return demo_startup.report(result)


def test_a_different_choice_is_shown_with_its_measured_steps():
    usual = {"1,32": 20.0, "2,128": 70.0}
    runs = [_run(0, [1, 32], usual), _run(1, [2, 128], {"1,32": 26.0, "2,128": 68.0}),
            _run(2, [1, 32], {"1,32": 22.0, "2,128": 72.0})]
    text = _report(runs)
    assert ("  - run 1 chose N=2 B=128; its measured steps against the other runs' median: "
            "N=1 B=32: 26 ms against 21 ms; N=2 B=128: 68 ms against 71 ms") in text
    assert "run 0 chose" not in text and "run 2 chose" not in text


def test_runs_without_the_steps_or_with_one_choice_add_nothing():
    same = [_run(i, [1, 32], {"1,32": 20.0}) for i in range(3)]
    assert "chose" not in _report(same)
    unrecorded = [_run(0, [1, 32], None), _run(1, [2, 128], None)]
    assert "chose" not in _report(unrecorded)  # runs before the steps were recorded
