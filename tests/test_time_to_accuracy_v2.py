"""The time-to-accuracy re-run's pure parts (issue 43, item 4), on made-up run records and a
plan from synthetic profiles: each B's times and epochs to a target read from its
evaluations, E0, the best B, each search's choices with their regret intervals, the M0 row,
the plan's epochs beside the runs', the report (rebuilt alike from its JSON), and the
runner's schedule. Nothing trains and no Ray starts."""

import json
import math

import pytest

from benchmarks.accuracy import time_to_accuracy_v2 as v2
from benchmarks.accuracy.time_to_accuracy import kept_plan
from benchmarks.accuracy.time_to_accuracy_v2_report import judged_targets, per_batch, report

SETTINGS = v2.Settings(1000, 500, (0.5, 0.8), (5, 6, 7), (32, 128), eval_every_samples=250,
                       max_epochs=5, searches=2)
PROVENANCE = {"command": "python -m benchmarks time-to-accuracy-v2", "commit": "abc",
              "date": "today", "machine": "test"}


def made_run(batch, seed, reach, eval_s=0.5):
    """A run evaluated every 250 samples, 1 s of training each; reach: the evaluation
    (counted from 1) that first reaches 0.5 and the one that reaches 0.8, None: never."""
    early, late = reach
    evaluations = []
    for count in range(1, 9):
        accuracy = 0.8 if late and count >= late else 0.5 if early and count >= early else 0.3
        evaluations.append({"samples": 250 * count, "steps": 250 * count // batch,
                            "seconds": count * (1.0 + eval_s), "val_accuracy": accuracy})
        if late and count == late:
            break
    return {"batch": batch, "seed": seed, "version": 2, "evaluations": evaluations,
            "eval_seconds_each": eval_s, "test_accuracy": 0.8, "epochs": 2, "target": {},
            "notes": [], "wall_s": 30.0}


def protocol():
    """The settings' record, with a bootstrap of 200 resamples (the protocol's 10000 take
    seconds per interval)."""
    record = v2.protocol_record(SETTINGS)
    return {**record, "bootstrap": {**record["bootstrap"], "resamples": 200}}


RUNS = ([made_run(32, seed, (2, 4)) for seed in SETTINGS.seeds]
        + [made_run(128, seed, (3, late)) for seed, late in zip(SETTINGS.seeds, (8, 7, None))])


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plans")
    return [kept_plan(folder / f"{i}.plan.json", SETTINGS.batches, SETTINGS.train_images, True)
            for i in range(2)]


def test_each_batch_reads_its_time_and_epochs_to_a_target_from_its_evaluations():
    times = per_batch(RUNS, 0.5, "train_seconds")
    assert times == {32: [2.0] * 3, 128: [3.0] * 3}  # its evaluations' seconds taken off
    late = per_batch(RUNS, 0.8, "train_seconds")
    assert late[32] == [4.0] * 3 and late[128][:2] == [8.0, 7.0] and math.isinf(late[128][2])
    assert per_batch(RUNS, 0.8, "samples", scale=SETTINGS.train_images)[32] == [1.0] * 3


def test_every_search_is_judged_at_every_target_the_first_with_the_m0_row(plans):
    record = protocol()
    judged = judged_targets(plans, RUNS, record)
    assert len(judged) == 2 and set(judged[0]["targets"]) == {"0.5", "0.8"}
    late = judged[0]["targets"]["0.8"]
    assert late["e0"] == 1.0 and late["best_batch"] == 32
    assert set(late["choices"]) == {"time_to_accuracy", "time", "knee"}
    for choice in late["choices"].values():
        point, low, high = choice["regret"]
        assert low <= point <= high or math.isinf(point)
    assert late["choices"]["time"]["global_batch"] == 128  # the fastest epoch, slower here
    assert late["choices"]["time"]["regret"][0] == pytest.approx(8.0 / 4.0 - 1)  # median of 8, 7, inf
    assert "m0" in late and "m0" not in judged[1]["targets"]["0.8"]
    rows = {r["global_batch"]: r for r in late["rows"]}
    assert rows[32]["predicted_epochs"] == pytest.approx(1.0)  # E0 at M0, by definition
    assert rows[128]["reached"] == 2 and rows[128]["seeds"] == 3


def test_the_report_is_rebuilt_alike_from_its_json(plans):
    record = protocol()
    result = {"provenance": PROVENANCE, "quick": False, "protocol": record, "runs": RUNS,
              "searches": judged_targets(plans, RUNS, record)}
    markdown = report(result)
    assert markdown == report(json.loads(json.dumps(result)))
    assert "#### Target 80%" in markdown and "search 1: knee" in markdown
    assert "| 128 | 2/3 |" in markdown  # one seed never reached 80 %
    assert "train at M0" in markdown and "Runs: 6 of 6" in markdown


def test_no_choice_is_judged_where_the_m0_runs_never_reach_a_target(plans):
    runs = [made_run(32, seed, (2, None)) for seed in SETTINGS.seeds] + RUNS[3:]
    record = protocol()
    result = {"provenance": PROVENANCE, "quick": False, "protocol": record, "runs": runs,
              "searches": judged_targets(plans, runs, record)}
    assert result["searches"][0]["targets"]["0.8"]["choices"] == {}
    assert "the B = M0 runs never reached the target" in report(result)


def test_the_runs_cover_every_batch_and_seed_once_the_order_rotating():
    specs = v2.run_specs(v2.FULL)
    keys = [v2.run_key(s) for s in specs]
    assert len(keys) == len(set(keys)) == len(v2.FULL.seeds) * len(v2.FULL.batches)
    firsts = [specs[i * len(v2.FULL.batches)]["batch"] for i in range(len(v2.FULL.seeds))]
    assert len(set(firsts)) == len(firsts)  # no B always runs first
    assert v2.FULL.targets == (0.82, 0.86, 0.87) and v2.FULL.seeds == (5, 6, 7, 8, 9)


def test_the_report_says_where_the_machines_speed_varied_between_a_batchs_runs():
    from benchmarks.accuracy.time_to_accuracy_v2_report import speed_lines

    # made_run: 1 s of training per 250 samples; at B = 25, 10 steps a second: 100 ms.
    even = [made_run(25, seed, (1, 2)) for seed in (0, 1)]
    lines = "\n".join(speed_lines(even))
    assert "| 25 | 100 | 100 |" in lines and "No B's runs differ by more than 2x" in lines
    slow = made_run(25, 2, (1, 2))
    for row in slow["evaluations"]:
        row["seconds"] = row["seconds"] * 4 - 1.5  # its training about 5x slower
    uneven = "\n".join(speed_lines([*even, slow]))
    assert "B = 25: " in uneven and "measure the machine as much as the batch" in uneven
