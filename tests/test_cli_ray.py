"""Every `tula-ray` verb that starts Ray, run to success as a user types it (a subprocess of
the installed command, one per verb), and checked by what it wrote: plan rows, the choice,
figures and the training metrics. Each joins the run's shared Ray through RAY_ADDRESS, as
a driver `ray job submit` starts does: the verb is what is tested, not Ray's start (the
local start is tests/test_local_ray.py's). Tiny grids and data keep each run short."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tula_ray.cluster import ADDRESS_ENV
from tula_ray.planning.plan import Plan

pytestmark = pytest.mark.ray

TIMEOUT_S = 900  # a hang fails the test instead of the whole CI run


@pytest.fixture
def joined(ray_session, monkeypatch) -> str:
    """Subprocesses started by this test join the run's shared Ray."""
    monkeypatch.setenv(ADDRESS_ENV, ray_session)
    return ray_session


def tula_ray_command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`tula-ray ARGS` from the environment pytest runs in (the installed console script)."""
    script = Path(sys.executable).with_name("tula-ray")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tula_ray.cli"]
    done = subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=os.environ.copy())
    assert done.returncode == 0, f"tula-ray {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done


def check_plan(out: Path, printed: str, measured: set[tuple[int, int]]) -> Plan:
    plan = Plan.from_json(out / "plan.json")
    table = plan.table
    assert set(zip(table["num_workers"], table["global_batch"])) >= measured
    rows = table[table["source"] == "measured"]
    assert set(zip(rows["num_workers"], rows["global_batch"])) == measured
    assert (rows["status"] == "ok").all() and (rows["measured_step_time_s"] > 0).all()
    choice = plan.choice
    assert (choice.num_workers, choice.global_batch) in measured  # every candidate was run
    assert f"N={choice.num_workers}, B={choice.global_batch}" in printed
    for figure in ("time_vs_batch.png", "cost_vs_batch.png"):
        assert (out / figure).read_bytes()[:4] == b"\x89PNG"
    return plan


def check_quiet(printed: str, candidates: int) -> None:
    """A search's default output (issue 41, item 5): the dashboard's line, a line per
    candidate, no Tune boxes nor Ray Train's INFO logs; tula-ray's lines in 100 columns."""
    lines = printed.splitlines()
    assert "Ray dashboard: http" in printed
    assert sum(1 for line in lines if re.match(r"  \[\d+/\d+\] N=\d+ B=\d+ ", line)) == candidates
    for noise in ("Trial status", "Configuration for experiment", "Reporting training result",
                  "Started a local Ray instance"):
        assert noise not in printed, noise
    ours = [line for line in lines if "pid=" not in line]  # not a Ray process's own line
    assert max(len(line) for line in ours) <= 100, max(ours, key=len)


def test_search_from_a_config_file_then_tune_and_train_its_plan(joined, tmp_path):
    config = tmp_path / "search.yaml"
    config.write_text(f"""\
workload: fashion-mnist-cnn
workload_options: {{train_subset: 512}}
cluster_sizes: [1]
min_batch: 32
max_batch: 64
objective: time
reference_batch: 64
warmup_steps: 1
measure_steps: 2
storage_path: {tmp_path / "ray_results"}
runtime_env: {{env_vars: {{TULA_CLI_MARK: "1"}}}}
""")
    searched = tula_ray_command("search", str(config), "--out", str(tmp_path / "plan"),
                                cwd=tmp_path)
    plan = check_plan(tmp_path / "plan", searched.stdout, measured={
        (1, 32), (1, 64)})  # two candidates: every strategy runs them both
    check_quiet(searched.stdout + searched.stderr, candidates=2)
    assert plan.meta["workload_options"] == {"train_subset": 512}
    assert plan.meta["reference_batch"] == 64  # the config's key reaches the plan

    # A driver joining a cluster brings its own job's runtime environment.
    tuned = tula_ray_command(
        "tune", str(tmp_path / "plan" / "plan.json"), "--strategy", "lrs", "--trials", "1",
        "--epochs", "1", "--storage-path", str(tmp_path / "ray_results"),
        "--runtime-env-json", '{"env_vars": {"TULA_CLI_MARK": "1"}}',
        "--out", str(tmp_path / "tune"), cwd=tmp_path)
    config = json.loads((tmp_path / "tune" / "tuned.json").read_text())
    assert config["strategy"] == "lrs" and 1e-3 <= config["lr"] <= 0.2  # LRS's tuned space
    assert "best of 1 trials" in tuned.stdout
    # A trial never restarts: no preemption watcher, nor the error line Ray logs for one.
    assert "PreemptionWatcher" not in tuned.stdout + tuned.stderr

    # Trained to an accuracy (issue 43): it stops at the first evaluation of the validation
    # split that reaches it, and reads the test set once, at the end.
    trained = tula_ray_command(
        "train", str(tmp_path / "plan" / "plan.json"), "--config", str(tmp_path / "tune" /
                                                                       "tuned.json"),
        "--epochs", "3", "--target-accuracy", "0.15", "--eval-every-samples", "128",
        "--batch", "adaptive", "--storage-path", str(tmp_path / "ray_results"),
        "--out", str(tmp_path / "train"), cwd=tmp_path)
    metrics = pd.read_csv(tmp_path / "train" / "train_metrics.csv")
    last = metrics.iloc[-1]
    assert last["target_reached"] and last["val_accuracy"] >= 0.15 and len(metrics) <= 3
    assert metrics["test_accuracy"].iloc[:-1].isna().all() and 0 <= last["test_accuracy"] <= 1
    assert last["samples_to_target"] % 128 == 0 and last["time_to_target_s"] > 0
    assert "target accuracy 0.15 reached in" in trained.stdout
    # ... with an adaptive batch (issue 44): B chosen among the plan's N = 1 candidates at
    # every interval, each epoch's row with the B it ended at, the decisions printed.
    assert set(metrics["global_batch"]) <= {32, 64}
    assert re.search(r"adaptive batch: \d+ decisions, \d+ switches", trained.stdout)
    assert (f"trained N={plan.choice.num_workers}, B={plan.choice.global_batch} with lrs"
            in trained.stdout)
    # Rank 0's line per epoch reaches the driver's terminal (Ray's log_to_driver); Ray
    # Train's INFO logs (each report's dict) do not, below verbose 2.
    assert "epoch 1 of 3: train loss" in trained.stdout + trained.stderr
    assert "Reporting training result" not in trained.stdout + trained.stderr


def test_demo_searches_to_a_time_to_accuracy(joined, tmp_path):
    """`tula-ray demo` as the start-up benchmark runs it (`tula_ray.cli.main` in a process of
    its own, timed from the inside), which then reports it, and so does the profiling-wall
    benchmark: both benchmarks' smoke tests. (The console script itself runs in
    tests/test_benchmarks_first_contact.py: `python -m tula_ray.cli demo` with no data.)"""
    from benchmarks.startup import demo_startup
    from benchmarks.startup import profiling_wall
    from benchmarks.common import RESULTS_DIR

    out = tmp_path / "demo"
    ran = demo_startup.demo(demo_startup.REPO, out, (
        "--cluster-sizes", "1", "--min-batch", "64", "--max-batch", "64",
        "--objective", "time_to_accuracy", "--reference-batch", "32"), join=joined)
    printed = (out / "demo.log").read_text()
    plan = check_plan(out, printed, measured={(1, 64)})
    # the time to accuracy, from the gradient noise the one profile row measured; where that
    # phi leaves E(64) within 5 % of 1 (phi >= 576 at M0 = 32: 30 steps of a barely trained
    # model measured 581 once), the plan chooses by the knee and says why (noise_checks)
    assert plan.objective == "time_to_accuracy" and plan.meta["reference_batch"] == 32
    if plan.choice.objective != "time_to_accuracy":
        assert plan.choice.objective == "knee"
        assert plan.choice.reason.startswith("time_to_accuracy fell back to the knee rule")
        assert "every candidate's efficiency is within 5% of 1" in printed
    assert plan.meta["noise"]["steps"] >= 3 and plan.meta["launches"] == 1
    row = plan.chosen
    assert row["efficiency"] <= 1.0 and row["epochs_to_target"] >= plan.epochs
    assert row["time_to_accuracy_s"] >= row["estimated_total_time_s"] > 0
    assert "gradient noise" in printed and "memory probe" in printed
    assert printed.startswith("Fashion-MNIST: ")  # where the data came from, first
    check_quiet(printed, candidates=1)
    assert len(printed.splitlines()) <= 40  # the demo's whole output, the plan included

    # The split adds up to the wall, and each part is a time.
    assert sum(ran[part] for part in demo_startup.PARTS if part != "timed_s") == \
        pytest.approx(ran["wall_s"])
    assert 0 < ran["timed_s"] < ran["candidates_s"] and ran["check_s"] > 0
    # The one launch's chain, read from Ray's task events of this demo's job alone (not the
    # shared Ray's other launches): its trial actor within Tune's time, the rest within the
    # launch's start (their clocks are Ray's and the trial's: a second's slack).
    trial_actor, *in_start = demo_startup.ANATOMY
    assert ran["launches_read"] == 1 and all(ran[part] > 0 for part in demo_startup.ANATOMY)
    assert ran[trial_actor] < ran["tune_s"] + 1
    assert sum(ran[part] for part in in_start) < ran["launch_start_s"] + 1
    assert set(ran["step_ms"]) == {"1,64"} and ran["step_ms"]["1,64"] > 0  # each measured
    startup = demo_startup.run(quick=True, ran=ran)
    assert startup["choices"] == [[1, 64]] and startup["outside_ratio"] is None
    quick_report = (RESULTS_DIR / "demo_startup_quick.md").read_text()
    assert "| part (median s) |" in quick_report and "| tune: trial actor |" in quick_report

    walls = profiling_wall.run(quick=True, ran=profiling_wall.walls(out, ran["wall_s"]))
    (run,) = walls["runs"]
    assert run["tree"] == "this" and run["launches"] == 1
    assert 0 < run["profiling_wall_s"] < run["wall_s"]
    assert "this (" in (RESULTS_DIR / "profiling_wall_quick.md").read_text()
