"""The adaptive-batch benchmark's pure parts (issue 44, item 4), on made-up run records: the
time to a target, the selection, the ratio of medians and its bootstrap interval, the goals'
verdicts, the GPU projection, the report (rebuilt alike from its JSON), the protocol's
split and the runner's schedule. Nothing trains and no Ray starts."""

import dataclasses
import json
import math

import pytest

from benchmarks.accuracy import adaptive_batch_protocol as protocol_module
from benchmarks.accuracy.adaptive_batch import (ADAPTIVE_MISSING, adaptive_support,
                                                scoring_specs, selection_specs)
from benchmarks.accuracy.adaptive_batch_efficiency import (efficiency_rows,
                                                          implied_noise_scale,
                                                          trajectory_noise_scale)
from benchmarks.accuracy.adaptive_batch_protocol import (
    PROTOCOL, QUICK, Protocol, WorkloadProtocol, gpu_step_seconds, projected_seconds,
    protocol_record, step_seconds_at)
from benchmarks.accuracy.adaptive_batch_report import best_fixed, judge, report, verdicts
from benchmarks.accuracy.adaptive_batch_runs import (ADAPTIVE, step_ms, steps_by_batch,
                                                     time_to_target)
from benchmarks.common.bootstrap import Bootstrap, ratio, ratio_of_medians

EARLY, LATE = 0.5, 0.8
WORKLOAD = WorkloadProtocol("fashion-mnist-cnn", 1000, 500, (EARLY, LATE), ("made up", "made up"),
                            eval_every_samples=100, max_epochs=5, min_batch=32, max_batch=128)
MADE_UP = Protocol((WORKLOAD,), bootstrap=Bootstrap(resamples=200))


def made_run(batch, seed, reach_s, eval_s=0.5, steps_each=10, batches=None):
    """A run whose evaluations climb 0.1 a time, reaching EARLY at reach_s[0] and LATE at
    reach_s[1] (seconds on train's clock, evaluations included); None: never."""
    early_s, late_s = reach_s
    evaluations = []
    for index, accuracy in enumerate((0.3, 0.5, 0.6, 0.8)):
        seconds = {1: early_s, 3: late_s}.get(index, 1.0 + index)
        if seconds is None:
            seconds, accuracy = 1.0 + index, 0.4
        row = {"steps": steps_each * (index + 1), "samples": steps_each * (index + 1) * 64,
               "seconds": seconds, "val_accuracy": accuracy}
        if batches:
            row["global_batch"] = batches[index]
        evaluations.append(row)
    return {"workload": WORKLOAD.name, "batch": batch, "seed": seed, "version": 1,
            "evaluations": evaluations, "eval_seconds_each": eval_s, "test_accuracy": 0.81,
            "epochs": 2, "notes": [], "wall_s": 10.0}


def test_time_to_target_is_the_first_evaluation_there_less_the_evaluations():
    run = made_run(64, 0, (4.0, 9.0))
    assert time_to_target(run, EARLY) == {"seconds": 4.0, "train_seconds": 3.0, "samples": 1280,
                                          "steps": 20}
    assert time_to_target(run, LATE)["train_seconds"] == 9.0 - 4 * 0.5
    assert math.isinf(time_to_target(run, 0.95)["train_seconds"])


def test_steps_by_batch_fixed_and_adaptive():
    assert steps_by_batch(made_run(64, 0, (4.0, 9.0)), LATE) == {64: 40}
    adaptive = made_run(ADAPTIVE, 0, (4.0, 9.0), batches=[32, 32, 64, 128])
    assert steps_by_batch(adaptive, EARLY) == {32: 20}
    assert steps_by_batch(adaptive, LATE) == {32: 20, 64: 10, 128: 10}
    assert steps_by_batch(made_run(ADAPTIVE, 0, (4.0, 9.0)), LATE) == {}  # no batch recorded
    assert steps_by_batch(made_run(64, 0, (4.0, None)), LATE) == {64: math.inf}


def test_the_best_fixed_batch_is_picked_on_the_selection_seeds_only():
    runs = [made_run(32, s, (3.0, 9.0)) for s in (0, 1, 2)] + \
           [made_run(64, s, (3.0, 7.0)) for s in (0, 1, 2)] + \
           [made_run(32, s, (3.0, 1.0)) for s in (3, 4, 5)]  # scoring seeds: not seen
    best, medians = best_fixed(runs, WORKLOAD.name, [32, 64, 128], (0, 1, 2), LATE,
                               "train_seconds")
    assert best == 64 and math.isnan(medians[128])
    assert best_fixed(runs, WORKLOAD.name, [32, 64], (0, 1, 2), EARLY, "train_seconds")[0] == 32


def test_ratio_of_medians_and_its_interval():
    assert ratio_of_medians([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], 100, 0) == (2.0, 2.0, 2.0)
    point, low, high = ratio_of_medians([1.0, 2.0, 3.0], [2.0, 2.0, 2.0], 500, 0)
    assert point == 1.0 and low < 1.0 < high
    assert ratio_of_medians([1.0, 2.0, 3.0], [2.0, 2.0, 2.0], 500, 0) == (point, low, high)
    assert ratio_of_medians([], [1.0], 10, 0)[0] != ratio_of_medians([], [1.0], 10, 0)[0]  # NaN
    assert ratio_of_medians([math.inf] * 3, [1.0] * 3, 50, 0)[:2] == (math.inf, math.inf)
    assert ratio(1.0, math.inf) == 0.0 and math.isnan(ratio(math.inf, math.inf))


def test_gpu_step_seconds_and_the_projection():
    recorded = [{"rows": [
        {"workload": "cnn", "global_batch": 32, "precision": "fp32", "step_s": 0.002},
        {"workload": "cnn", "global_batch": 128, "precision": "fp32", "step_s": 0.008},
        {"workload": "cnn", "global_batch": 128, "precision": "bf16", "step_s": 1.0},
        {"workload": "resnet18", "skipped": "torchvision is not installed"}]}]
    step_s = gpu_step_seconds(recorded, "fashion-mnist-cnn")
    assert step_s == {32: 0.002, 128: 0.008}
    assert step_seconds_at(step_s, 64) == pytest.approx(0.004)  # log-log between 32 and 128
    assert step_seconds_at(step_s, 256) is None
    assert projected_seconds({32: 100, 64: 50}, step_s) == (pytest.approx(0.4), "")
    seconds, why = projected_seconds({256: 10}, step_s)
    assert seconds is None and why.startswith("no projection: B = 256")
    assert projected_seconds({32: 10}, {})[1].startswith("no projection: no GPU step times")
    assert projected_seconds({32: math.inf}, step_s) == (math.inf, "")


def made_result(adaptive_late=5.0, static_late=9.0, plan_adaptive=None, adaptive=True):
    """Fixed 32 (slow late), 64 (best), 128 on the selection seeds; the arms on 3-5."""
    runs = []
    for seed in (0, 1, 2):
        runs += [made_run(32, seed, (2.0, 9.0 + 2)), made_run(64, seed, (3.0, 7.0)),
                 made_run(128, seed, (4.0, None))]
    for seed in (3, 4, 5):
        runs += [made_run(32, seed, (2.0, static_late + 2)), made_run(64, seed, (3.0, 7.0))]
        if adaptive:
            runs.append(made_run(ADAPTIVE, seed, (2.0, adaptive_late + 2),
                                 batches=[32, 32, 64, 64]))
    return {"command": "python -m benchmarks adaptive-batch", "commit": "abc", "date": "today",
            "machine": "here", "quick": False, "protocol": protocol_record(MADE_UP),
            "workloads": {WORKLOAD.name: {
                "fixed_batches": [32, 64, 128], "reference_batch": 32, "e0": {},
                "static": {str(EARLY): 32, str(LATE): 32}, "best": {},
                "plan_adaptive_s": {str(LATE): plan_adaptive}}},
            "runs": runs, "adaptive_arm": "ok" if adaptive else ADAPTIVE_MISSING,
            "limit": "made up.", "gpu": {"step_s": {WORKLOAD.name: {"32": 0.002, "128": 0.008}},
                                        "source": "made up"}}


def _verdicts(result):
    workload = result["protocol"]["workloads"][0]
    judged = {t: judge(result, workload, t) for t in workload["targets"]}
    return [met for _, _, met in verdicts(result, workload, judged)]


def test_the_goals_verdicts():
    # Adaptive late 5 s against the best fixed (64) 5 s and the static (32) 9 s.
    assert _verdicts(made_result(plan_adaptive=5.5)) == [
        "yes", "yes", "yes", "n/a (the plan has no adaptive row)", "yes"]
    # Slower than the best fixed B late, and not 15 % under the static choice.
    slow = _verdicts(made_result(adaptive_late=8.0, plan_adaptive=5.0))
    assert slow[1:3] == ["**no**", "**no**"] and slow[4] == "**no**"
    missing = _verdicts(made_result(adaptive=False))
    assert missing[:3] == [f"n/a ({ADAPTIVE_MISSING})"] * 3


def test_the_report_is_rebuilt_alike_from_its_json():
    result = made_result(plan_adaptive=5.5)
    markdown = report(result)
    assert report(json.loads(json.dumps(result, default=float))) == markdown
    assert "best fixed B picked on the selection seeds: 64" in markdown
    assert "no projection: the run records no steps per batch" not in markdown
    assert "| adaptive | adaptive |" in markdown and "| static | 32 |" in markdown
    assert f"n/a ({ADAPTIVE_MISSING})" in report(made_result(adaptive=False))


def test_adaptive_support_reads_trains_signature():
    def old_train(plan, strategy="ags-ns", *, seed=0):
        pass

    def new_train(plan, strategy="ags-ns", *, batch=None, seed=0):
        pass

    assert adaptive_support(old_train) == ADAPTIVE_MISSING
    assert adaptive_support(new_train) == "ok"


def test_the_schedule():
    specs = selection_specs(WORKLOAD, MADE_UP, [32, 64, 128])
    assert [s["batch"] for s in specs] == [32, 64, 128, 64, 128, 32, 128, 32, 64]
    arms = {"best": {"0.5": 32, "0.8": 64}, "static": {"0.5": 32, "0.8": None},
            "reference_batch": 32}
    scored = scoring_specs(WORKLOAD, MADE_UP, arms, adaptive=True)
    assert [(s["batch"], s["seed"]) for s in scored[:3]] == [(ADAPTIVE, 3), (32, 3), (64, 3)]
    assert len(scored) == 9
    assert ADAPTIVE not in [s["batch"] for s in scoring_specs(WORKLOAD, MADE_UP, arms, False)]


def test_the_protocol_is_fixed_and_keeps_selection_and_scoring_apart():
    assert not set(PROTOCOL.selection_seeds) & set(PROTOCOL.scoring_seeds)
    for workload in PROTOCOL.workloads:
        early, late = workload.targets
        assert 0 < early < late < 1
        assert workload.train_images <= protocol_module.VAL_START
    with pytest.raises(dataclasses.FrozenInstanceError):
        PROTOCOL.selection_seeds = (0,)
    assert QUICK.workloads[0].train_images < PROTOCOL.workloads[0].train_images


def test_the_split_is_pinned_and_disjoint_from_what_other_benchmarks_use():
    torch = pytest.importorskip("torch")
    assert protocol_module.split_digest() == protocol_module.SPLIT_SHA256
    taken = set(range(30_000)) | set(torch.randperm(
        60_000, generator=torch.Generator().manual_seed(0))[:10_000].tolist())
    for workload in PROTOCOL.workloads:
        train, val = protocol_module.split_indices(workload)
        assert len(set(train)) == workload.train_images and len(set(val)) == workload.val_images
        assert not set(train) & set(val) and not (set(train) | set(val)) & taken


# --------------------------------------------------------------------------- version 2

def made_result_v2(plan_train_s, plan_whole_s):
    """made_result's runs on version 2's protocol: the plan's row judged by its training
    part (selection seeds 0-2 and scoring seeds 3-5 kept, so the runs are the same)."""
    from benchmarks.accuracy.adaptive_batch_v2_protocol import ProtocolV2

    result = made_result()
    made_up = ProtocolV2((WORKLOAD,), bootstrap=Bootstrap(resamples=200),
                         selection_seeds=(0, 1, 2), scoring_seeds=(3, 4, 5))
    result["protocol"] = protocol_record(made_up)
    planned = result["workloads"][WORKLOAD.name]
    planned["plan_adaptive_s"] = {str(LATE): plan_whole_s}
    planned["plan_adaptive_train_s"] = {str(LATE): plan_train_s}
    return result


def test_version_2_judges_the_plan_rows_training_part_and_shows_the_speed():
    # The adaptive arm's late time is 5 s (train_seconds): a training part of 5.5 s is
    # within 20 %, whatever the whole row (start-up and evaluations) says.
    met = _verdicts(made_result_v2(plan_train_s=5.5, plan_whole_s=30.0))
    assert met[4] == "yes"
    assert _verdicts(made_result_v2(plan_train_s=30.0, plan_whole_s=5.5))[4] == "**no**"
    markdown = report(made_result_v2(plan_train_s=5.5, plan_whole_s=30.0))
    assert "the plan's adaptive row's training part at 80%" in markdown
    assert "Not judged: the plan's adaptive row's whole time" in markdown
    # ... and beside the adaptive runs' whole train call (made_run: wall_s 10 s) at LATE
    assert (f"the whole row at {LATE:.0%}, where every run stops, against the adaptive runs' "
            "median wall (the whole `train` call, Ray already up): 30 s against 10 s (+200%)"
            in markdown)
    assert "adaptive_batch_v2_protocol.py" in markdown
    assert "ms/step" in markdown and "ms/step" not in report(made_result(plan_adaptive=5.5))
    # made_run's fixed runs: 4 evaluations of 0.5 s, the last at 7 s after 40 steps.
    assert step_ms(made_run(64, 0, (3.0, 7.0))) == pytest.approx(1000 * (7.0 - 2.0) / 40)


def test_version_2_is_new_runs_on_new_seeds_its_scored_arms_rotating():
    from benchmarks.accuracy import adaptive_batch_v2_protocol as v2

    seeds = {*v2.SELECTION_SEEDS, *v2.SCORING_SEEDS}
    assert len(seeds) == 6 and not seeds & {*PROTOCOL.selection_seeds, *PROTOCOL.scoring_seeds}
    assert v2.PROTOCOL.workloads == PROTOCOL.workloads and v2.PROTOCOL.goals == PROTOCOL.goals
    assert v2.PROTOCOL.version == 2 and v2.QUICK.version == 2
    arms = {"best": {"0.5": 32, "0.8": 64}, "static": {"0.5": 32, "0.8": None},
            "reference_batch": 32}
    made_up = dataclasses.replace(v2.PROTOCOL, scoring_seeds=(3, 4, 5))
    scored = [(s["batch"], s["seed"]) for s in scoring_specs(WORKLOAD, made_up, arms, True)]
    assert scored == [(ADAPTIVE, 3), (32, 3), (64, 3), (32, 4), (64, 4), (ADAPTIVE, 4),
                      (64, 5), (ADAPTIVE, 5), (32, 5)]


def test_version_2_sets_each_adaptive_run_before_its_first_switch_beside_its_fixed_twin():
    from benchmarks.accuracy.adaptive_batch_post_hoc import start_overhead

    result = made_result_v2(plan_train_s=5.5, plan_whole_s=30.0)
    found = start_overhead(result["runs"], WORKLOAD.name, (3, 4, 5))
    # made_run's adaptive runs train B = 32 for two evaluations, as the fixed 32 runs do.
    assert [(r["seed"], r["batch"], r["steps"]) for r in found] == [(3, 32, 20), (4, 32, 20),
                                                                    (5, 32, 20)]
    assert all(r["same_accuracy"] and r["ratio"] == pytest.approx(1.0) for r in found)
    slower = [r for r in result["runs"] if r["batch"] == ADAPTIVE and r["seed"] == 3][0]
    slower["evaluations"][1]["seconds"] += 1.0  # 2 s of training where its twin took 1
    slower["evaluations"][0]["val_accuracy"] = 0.31
    first = start_overhead(result["runs"], WORKLOAD.name, (3,))[0]
    assert first["ratio"] == pytest.approx(2.0) and not first["same_accuracy"]
    assert "before its first switch" in report(result)
    assert "before its first switch" not in report(made_result(plan_adaptive=5.5))


# --------------------------------------------------------------------------- version 3

def test_version_3_scores_again_on_new_seeds_from_version_2s_plans_and_selection(
        tmp_path, monkeypatch):
    from benchmarks.accuracy import adaptive_batch as runner
    from benchmarks.accuracy import adaptive_batch_v2_protocol as v2
    from benchmarks.accuracy import adaptive_batch_v3_protocol as v3
    from benchmarks.common import Benchmark

    earlier = {*PROTOCOL.selection_seeds, *PROTOCOL.scoring_seeds, *v2.SELECTION_SEEDS,
               *v2.SCORING_SEEDS}
    assert len(set(v3.SCORING_SEEDS)) == 6 and not set(v3.SCORING_SEEDS) & earlier
    assert v3.PROTOCOL.selection_seeds == v2.SELECTION_SEEDS
    assert v3.PROTOCOL.workloads == v2.PROTOCOL.workloads and v3.PROTOCOL.goals == PROTOCOL.goals
    own = Benchmark(v3.RESULTS_NAME)
    assert runner.inputs_of(own, v3.PROTOCOL) == (Benchmark(v2.RESULTS_NAME), 2)
    assert runner.inputs_of(own, v3.QUICK) == (own, 3)  # --quick reads no recorded file
    # The selection is read from the earlier log, every run of it, and refused when one
    # is missing (never run again under the new version).
    monkeypatch.setattr("benchmarks.common.scaffold.RESULTS_DIR", tmp_path)
    made_up = dataclasses.replace(v3.PROTOCOL, workloads=(WORKLOAD,), selection_seeds=(0, 1))
    recorded = [made_run(b, s, (3.0, 7.0)) | {"version": 2} for s in (0, 1) for b in (32, 64)]
    log = tmp_path / f"{v2.RESULTS_NAME}.runs.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recorded))
    inputs = Benchmark(v2.RESULTS_NAME)
    read = runner.recorded_selection(WORKLOAD, made_up, [32, 64], inputs, 2)
    assert sorted((r["batch"], r["seed"]) for r in read) == [(32, 0), (32, 1), (64, 0), (64, 1)]
    log.write_text("".join(json.dumps(r) + "\n" for r in recorded[:-1]))
    with pytest.raises(RuntimeError, match="lacks 1 of the selection runs"):
        runner.recorded_selection(WORKLOAD, made_up, [32, 64], inputs, 2)
    with pytest.raises(RuntimeError, match="not recorded"):
        runner.recorded_plan(WORKLOAD, inputs)


# --------------------------------------------------------------------------- version 4

def test_version_4_searches_and_selects_again_on_new_seeds():
    from benchmarks.accuracy import adaptive_batch as runner
    from benchmarks.accuracy import adaptive_batch_v2_protocol as v2
    from benchmarks.accuracy import adaptive_batch_v3_protocol as v3
    from benchmarks.accuracy import adaptive_batch_v4_protocol as v4
    from benchmarks.common import Benchmark

    earlier = {*PROTOCOL.selection_seeds, *PROTOCOL.scoring_seeds, *v2.SELECTION_SEEDS,
               *v2.SCORING_SEEDS, *v3.SCORING_SEEDS}
    seeds = (*v4.SELECTION_SEEDS, *v4.SCORING_SEEDS)
    assert len(set(seeds)) == len(seeds) == 9 and not set(seeds) & earlier
    assert v4.PROTOCOL.workloads == v2.PROTOCOL.workloads and v4.PROTOCOL.goals == PROTOCOL.goals
    assert v4.PROTOCOL.rotate_scored_arms and v4.PROTOCOL.plan_row_measure == "training"
    own = Benchmark(v4.RESULTS_NAME)
    assert runner.inputs_of(own, v4.PROTOCOL) == (own, 4)  # its own plans and selection


def test_the_plans_step_time_beside_the_runs_reads_the_plan_rows_error():
    """Added after version 3's runs: the plan's ms per step at each fixed B against the fixed
    runs' (every seed), and the batches the plan's adaptive row trains."""
    result = made_result_v2(plan_train_s=5.5, plan_whole_s=30.0)
    assert "to read the plan row's error" not in report(result)  # recorded before: no line
    planned = result["workloads"][WORKLOAD.name]
    planned["plan_step_ms"] = {"64": 250.0}
    planned["plan_adaptive_batches"] = {str(LATE): "32 > 64"}
    line = [row for row in report(result).splitlines() if "to read the plan row's error" in row]
    # made_run's runs at B = 64: 40 steps in 7 s less 4 evaluations of 0.5 s: 125 ms.
    assert "B = 64: 250 against 125 (2.00x)" in line[0]
    assert "adaptive row trains at 80%: 32 > 64" in line[0]


def test_the_plans_step_time_is_its_fixed_rows_training_part_per_step():
    from benchmarks.accuracy.adaptive_batch_plan import WORLD_SIZE, plan_step_ms
    from tula_ray.planning.context import PlanContext
    from tula_ray.planning.plan import build_plan
    from tula_ray.planning.synthetic import example_params, synthetic_profiles
    from tula_ray.space import SearchSpace

    space = SearchSpace((WORLD_SIZE,), (32, 128))
    plan = build_plan(space, synthetic_profiles(space.candidates(), example_params()),
                      PlanContext(epochs=3, dataset_size=1000), search_strategy="full")
    steps = plan_step_ms(plan)
    assert set(steps) == {"32", "128"}
    row = plan.table[plan.table["global_batch"] == 128].iloc[0]
    training = (row["estimated_total_time_s"] - row["startup_time_s"]) / 3 \
        - row["eval_time_s"] - row["checkpoint_time_s"]
    assert steps["128"] == pytest.approx(1000 * training / (1000 // 128))
    assert steps["128"] >= 1000 * row["step_time_s"] * 0.999  # the strategy's cost adds


def _fixed_run(batch: int, seed: int, samples_to_target: int, phis: list[float]) -> dict:
    """A fixed run whose evaluations are evenly spaced up to the target, at `phis`."""
    spacing = samples_to_target // len(phis)
    return {"workload": "w", "batch": batch, "seed": seed,
            "evaluations": [{"samples": spacing * (i + 1), "noise_scale": phi,
                             "val_accuracy": 0.9 if i == len(phis) - 1 else 0.5}
                            for i, phi in enumerate(phis)]}


def test_the_implied_noise_scale_inverts_e_of_b():
    phi, reference = 150.0, 32
    for batch in (64, 256, 2048):
        efficiency = (phi + reference) / (phi + batch)
        assert implied_noise_scale(efficiency, batch, reference) == pytest.approx(phi)
    assert implied_noise_scale(1.0, 64, 32) == math.inf
    assert math.isnan(implied_noise_scale(0.25, 64, 32))  # below M0 / B: outside the model
    # a constant phi along the way is itself; a varying one, the harmonic mean of phi + M0
    assert trajectory_noise_scale([100.0] * 4, 32) == pytest.approx(100.0)
    assert trajectory_noise_scale([18.0, 68.0], 32) == pytest.approx(2 / (1 / 50 + 1 / 100) - 32)


def test_efficiency_rows_read_e_of_b_from_the_selection_runs_only():
    """Runs that follow E(B) with phi = 96 exactly give it back at every B; the scoring
    seeds' runs (here far off) and the adaptive arm are left out."""
    phi, reference, base = 96.0, 32, 6400
    runs = [_fixed_run(b, seed, round(base * (phi + b) / (phi + reference)), [phi] * 4)
            for b in (32, 128, 512) for seed in (0, 1, 2)]
    runs += [_fixed_run(128, 5, 100, [1.0]), {**_fixed_run(64, 0, 100, [1.0]),
                                              "batch": "adaptive"}]
    rows = efficiency_rows(runs, "w", (0, 1, 2), 0.8)
    assert [r["batch"] for r in rows] == [32, 128, 512] and all(r["runs"] == 3 for r in rows)
    assert rows[0]["implied"] == math.inf
    for row in rows[1:]:
        assert row["implied"] == pytest.approx(phi, rel=0.01)
        assert row["online"] == row["along"] == pytest.approx(phi)
    assert efficiency_rows(runs, "w", (0, 1, 2), 0.95) == []  # nothing reached it


def test_the_reach_of_a_schedule_is_read_from_the_selection_seeds_fixed_runs():
    """Selection seeds, train seconds (evaluations less): B = 32 reaches the early target at
    1 s and the late at 9 s (the static choice), 64 at 2 s and 5 s, 128 never late. Best
    fixed: 64, 5 / 9; best two-phase: 32 to the early target, then 64's own 5 - 2 s."""
    from benchmarks.accuracy.adaptive_batch_post_hoc import reach_lines

    result = made_result()
    workload = result["protocol"]["workloads"][0]
    judged = {t: judge(result, workload, t) for t in workload["targets"]}
    (line, _) = reach_lines(result, workload, judged)
    assert "the best fixed B (64) 0.56x" in line
    assert f"(B = 32 to {EARLY:.0%}, then B = 64's own time" in line and "0.44x" in line
