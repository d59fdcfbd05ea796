"""Protocol first (issues 43 and 44, item 4): each benchmark protocol was committed before
the first of its results files, and not changed after, read from git history
(`benchmarks.common.protocol_history`). With no results yet a protocol passes trivially, so
the check itself is shown to fail on constructed histories, and in a scratch repository.
Also the time-to-accuracy re-run's regret and "train at M0" pieces, on made-up times."""

import importlib
import math
import shutil
import subprocess

import pytest

from benchmarks.accuracy import time_to_accuracy_protocol as tta
from benchmarks.accuracy.time_to_accuracy_regret import (M0_HEADER, m0_baseline, m0_baseline_row,
                                                         regret_interval, regret_table)
from benchmarks.common.bootstrap import Bootstrap
from benchmarks.common.protocol_history import (ROOT, Commit, in_git_checkout, order_problems,
                                                protocol_first_problems)

PROTOCOLS = ("benchmarks.accuracy.adaptive_batch_protocol",
             "benchmarks.accuracy.adaptive_batch_v2_protocol",
             "benchmarks.accuracy.adaptive_batch_v3_protocol",
             "benchmarks.accuracy.adaptive_batch_v4_protocol",
             "benchmarks.accuracy.time_to_accuracy_protocol")


@pytest.mark.parametrize("module", PROTOCOLS)
def test_each_protocol_was_committed_before_its_first_results(module):
    if not in_git_checkout(ROOT):
        pytest.skip("not a git checkout: no history to read")
    protocol = importlib.import_module(module)
    path = module.replace(".", "/") + ".py"
    assert protocol_first_problems(path, list(protocol.RESULTS_GLOBS)) == []


def _ancestry(order):
    """is_ancestor over a linear history `order` (oldest first)."""
    return lambda a, b: order.index(a) < order.index(b)


def test_the_order_check_can_fail():
    history = ["p1", "r1", "p2"]  # protocol, then results, then the protocol changed
    first = Commit("r1", 200)
    assert order_problems([Commit("p1", 100)], first, _ancestry(history)) == []
    late = order_problems([Commit("p2", 300), Commit("p1", 100)], first, _ancestry(history))
    assert len(late) == 1 and late[0].startswith("the protocol changed at p2")
    same = order_problems([Commit("r1", 200)], first, _ancestry(history))  # one commit: both
    assert len(same) == 1
    assert order_problems([], first, _ancestry(history))[0].endswith(
        "commit the protocol before any run")
    assert order_problems([], None, _ancestry(history)) == []  # nothing recorded yet


def _commit(repo, message):
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c",
                    "commit.gpgsign=false", "commit", "-q", "-m", message], cwd=repo, check=True)


def test_the_check_reads_a_real_history(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "protocol.py").write_text("TARGETS = (0.8,)\n")
    _commit(tmp_path, "protocol")
    globs = ["results/bench.*"]
    assert protocol_first_problems("protocol.py", globs, tmp_path) == []
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.runs.jsonl").write_text("{}\n")
    _commit(tmp_path, "first run")
    assert protocol_first_problems("protocol.py", globs, tmp_path) == []
    (tmp_path / "protocol.py").write_text("TARGETS = (0.9,)\n")  # moved after a run
    _commit(tmp_path, "targets moved")
    problems = protocol_first_problems("protocol.py", globs, tmp_path)
    assert len(problems) == 1 and "not before the first recorded results" in problems[0]


def test_the_time_to_accuracy_rerun_protocol():
    from benchmarks.accuracy.time_to_accuracy_runs import FULL

    assert not set(tta.SEEDS) & set(FULL["seeds"])  # the targets' own runs judge nothing
    assert tta.TARGETS == FULL["targets"] and tta.BATCHES == FULL["batches"]
    assert tta.REFERENCE_BATCH in tta.BATCHES and tta.RESULTS_NAME != "time_to_accuracy"
    assert tta.EVAL_EVERY_SAMPLES < tta.TRAIN_IMAGES


BOOT = Bootstrap(resamples=300, seed=0)


def test_regret_with_its_interval():
    times = {32: [10.0, 10.0, 10.0], 64: [8.0, 8.0, 8.0], 128: [12.0, 12.0, 12.0]}
    assert regret_interval(times, 64, BOOT) == (0.0, 0.0, 0.0)
    assert regret_interval(times, 128, BOOT) == pytest.approx((0.5, 0.5, 0.5))
    noisy = {32: [9.0, 10.0, 11.0], 64: [7.0, 8.0, 12.0]}
    point, low, high = regret_interval(noisy, 32, BOOT)
    assert point == pytest.approx(0.25) and low <= 0.0 < point <= high  # the best may move
    assert math.isnan(regret_interval(times, 256, BOOT)[0])
    unreached = {32: [math.inf] * 3, 64: [8.0] * 3}
    assert regret_interval(unreached, 32, BOOT)[0] == math.inf


def test_the_m0_baseline_row():
    times = {32: [10.0, 10.0, 10.0], 64: [8.0, 8.0, 8.0], 128: [12.0, 12.0, 12.0]}
    baseline = m0_baseline(times, 128, 32, BOOT)
    assert baseline["m0_s"] == 10.0
    assert baseline["chosen_over_m0"] == pytest.approx((1.2, 1.2, 1.2))
    assert baseline["best_over_m0"] == pytest.approx((0.8, 0.8, 0.8))
    row = m0_baseline_row(0.86, 32, baseline)
    assert row == ["86%", 32, "10", "1.20 [1.20, 1.20]", "0.80 [0.80, 0.80]"]
    assert len(row) == len(M0_HEADER)
    missing = m0_baseline_row(0.86, 32, m0_baseline({64: [8.0]}, 64, 32, BOOT))
    assert missing[2:] == ["n/a"] * 3
    table = regret_table([("time_to_accuracy", 128, (0.5, 0.4, 0.6))])
    assert "| time_to_accuracy | 128 | +50% [+40%, +60%] |" in table
