"""Smoke tests of the benchmarks that need no Ray: `run(quick=True)` on a tiny grid.

The prediction benchmark's smoke test is in test_search_ray.py: it analyses the full
search that module already runs.

Quick outputs go to benchmarks/results/*_quick.* (ignored by git); BENCHMARKS.md is not touched.
"""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from result_checks import finite as _finite, table_rows as _table_rows

from benchmarks.common import RESULTS_DIR


def test_memory_accuracy_quick():
    from benchmarks.prediction import memory_accuracy

    result = memory_accuracy.run(quick=True)
    assert {"command", "commit", "date", "machine", "declared_device_memory_bytes", "models",
            "plot"} <= set(result)
    assert set(result["models"]) == set(memory_accuracy.QUICK_GRIDS)
    markdown = (RESULTS_DIR / "memory_accuracy_quick.md").read_text()
    assert (RESULTS_DIR / result["plot"]).stat().st_size > 0
    table = _table_rows(markdown, "| model | local batch b |")
    for model, m in result["models"].items():
        grid = memory_accuracy.QUICK_GRIDS[model]
        assert [row["local_batch"] for row in m["rows"]] == grid
        for row in m["rows"]:
            assert _finite(row["predicted_peak_mem_bytes"], row["peak_mem_bytes"], row["rel_error"])
            assert row["peak_mem_bytes"] > 0
        # the params' numbers, and the measured (b, peak) points the curve runs through
        numbers = [v for value in m["params"].values()
                   for v in (value if isinstance(value, list) else [value])]
        assert _finite(m["median_rel_error"], m["max_rel_error"], m["probe"]["wall_s"], *numbers)
        assert m["median_rel_error"] <= m["max_rel_error"]
        assert m["probe"]["local_batches"] == [memory_accuracy.MIN_LOCAL_BATCH * f
                                               for f in (1, 2, 4)]
        bound = m["max_local_batch"]
        assert 0 < bound["model_headroom"] <= bound["model_no_headroom"]
        # The true bound is exact: its peak fits the declared memory, the next b's does not.
        peaks = {s["local_batch"]: s["peak_mem_bytes"] for s in bound["search"]}
        device_bytes = result["declared_device_memory_bytes"]
        assert peaks[bound["true"]] <= device_bytes < peaks[bound["true"] + 1]
        # The product's checked bound never exceeds the true one, and is close to it here.
        for label, headroom in (("headroom", 0.1), ("no_headroom", 0.0)):
            checked = bound["checked"][label]
            assert 0 < checked["bound"] <= bound["true"]
            fits = [c for c in checked["checks"]
                    if c["peak_mem_bytes"] <= device_bytes * (1 - headroom)]
            assert checked["bound"] == max(c["local_batch"] for c in fits)
        assert bound["checked"]["no_headroom"]["bound"] >= 0.95 * bound["true"]
        assert _finite(m["refit"]["median_rel_error"])
        model_rows = [row for row in table if row[0] == model]
        assert len(model_rows) == len(grid)  # one row per measured batch
        assert [int(re.match(r"\d+", row[1]).group()) for row in model_rows] == grid


def test_batch_finder_quick():
    pytest.importorskip("lightning")
    from benchmarks.prediction import batch_finder

    result = batch_finder.run(quick=True)
    assert {"command", "commit", "tula", "lightning", "truth",
            "declared_device_memory_bytes"} <= set(result)
    true_b = result["truth"]["bound"]
    assert true_b > 0
    tula = result["tula"]
    for key in ("headroom", "no_headroom"):
        assert tula[key]["trials"] == len(tula["probe_trials"]) + len(tula[key]["checks"])
        assert len(tula["probe_trials"]) == 3 and _finite(tula[key]["wall_s"])
    # The checked bound: below the truth (a fitting peak was measured), near it with no headroom.
    assert 0 < tula["headroom"]["bound"] <= tula["no_headroom"]["bound"] <= true_b
    assert tula["no_headroom"]["bound"] >= 0.95 * true_b
    power = result["lightning"]["power, max_val"]
    # On CPU (no OOM) power mode doubles until max_val = true b and returns the next,
    # untried size; every size it ran was below max_val.
    assert power["bound"] >= true_b
    assert all(trial["batch_size"] < true_b and not trial["oom"] for trial in power["trials"])
    emulated = result["lightning"]["binsearch, emulated OOM"]
    assert any(trial["oom"] for trial in emulated["trials"])
    assert 0 < emulated["bound"] <= true_b
    for run in result["lightning"].values():
        assert run["num_trials"] == len(run["trials"]) > 0 and _finite(run["wall_s"])
        assert all(trial["batch_size"] <= true_b or trial["oom"] for trial in run["trials"])
    markdown = (RESULTS_DIR / "batch_finder_quick.md").read_text()
    rows = _table_rows(markdown, "| finder |")
    assert len(rows) == 2 + len(result["lightning"])
    assert all(_finite(float(row[2])) and int(row[3]) > 0 for row in rows)


def test_generalization_quick():
    """Two gloo workers (torch.multiprocessing), one seed, one epoch, every strategy."""
    from benchmarks.training import generalization
    from benchmarks.training.generalization_runs import QUICK, REFERENCE_BATCH, STRATEGY_RUNS

    result = generalization.run(quick=True)
    labels = {"reference", *STRATEGY_RUNS}
    assert {(row["global_batch"], row["label"]) for row in result["summary"]} == (
        {(REFERENCE_BATCH, "reference")}
        | {(b, label) for b in QUICK["batches"] for label in STRATEGY_RUNS})
    for run in result["runs"]:
        assert run["label"] in labels and len(run["history"]) == 1
        assert 0.0 <= run["test_accuracy"] <= 1.0
        scaled = run["history"][0].get("scaled_fraction")
        assert (scaled is not None) == run["label"].startswith("ags")
    assert (RESULTS_DIR / result["variability_plot"]).stat().st_size > 0
    markdown = (RESULTS_DIR / "generalization_quick.md").read_text()
    assert len(_table_rows(markdown, "| B | strategy |")) == len(result["summary"])


def test_ags_overhead_quick():
    from benchmarks.training import ags_overhead

    result = ags_overhead.run(quick=True)
    assert result["rounds"] == ags_overhead.QUICK_ROUNDS
    kinds = {"N=1": {"sub-batch/tensor", "sub-batch/element"},
             "N=2": {"local/tensor", "local/element", "sub-batch/tensor", "ags-ns/local"}}
    for setup, expected in kinds.items():
        overheads = result["overhead"][setup]
        assert set(overheads) == expected
        assert all(len(v) == result["rounds"] and _finite(*v) and min(v) > -1
                   for v in overheads.values())
    markdown = (RESULTS_DIR / "ags_overhead_quick.md").read_text()
    assert len(_table_rows(markdown, "| setup |")) == 6


def test_adaptive_start_cost_quick():
    """Both arms are what `train` builds: plain steps at B = 32, and AGS-NS's optimizer
    built at 2048 and set to B = 32."""
    from benchmarks.training import adaptive_start_cost

    result = adaptive_start_cost.run(quick=True)
    assert result["optimizers"] == {"plain": "SGD", "ags-ns built at 2048": "TulaOptimizer"}
    assert len(result["cost"]) == adaptive_start_cost.QUICK_ROUNDS
    assert _finite(*result["cost"]) and min(result["cost"]) > -1
    markdown = (RESULTS_DIR / "adaptive_start_cost_quick.md").read_text()
    assert len(_table_rows(markdown, "| arm |")) == 2


def test_eval_pricing_quick():
    """The recorded train-time cells re-read: the pass priced at b from each cell's plan
    equals what a plan built with eval_at_local_batch puts in its table there."""
    from benchmarks.prediction import eval_pricing
    from tula_ray.planning.context import PlanContext
    from tula_ray.planning.plan import Plan, build_plan
    from tula_ray.space import SearchSpace

    result = eval_pricing.run(quick=True)
    assert len(result["cells"]) == eval_pricing.QUICK_CELLS
    first = result["cells"][0]
    plan = Plan.from_json(eval_pricing.plan_path(eval_pricing.SOURCE, first["workload"]))
    context = PlanContext.from_dict({**plan.meta["plan_context"], "eval_at_local_batch": True})
    space = SearchSpace.of_pairs(plan.table["num_workers"], plan.table["global_batch"])
    again = build_plan(space, plan.profiles, context, search_strategy="full").table
    row = again[(again["num_workers"] == first["num_workers"])
                & (again["global_batch"] == first["global_batch"])].iloc[0]
    assert row["eval_time_s"] == pytest.approx(first["priced_s"], rel=1e-6)
    assert set(result["summary"]) == {"as_profiled_s", "priced_s"}
    markdown = (RESULTS_DIR / "eval_pricing_quick.md").read_text()
    assert len(_table_rows(markdown, "| workload | N | B |")) == eval_pricing.QUICK_CELLS


def test_eval_probe_quick():
    """The estimate and the baseline beside a whole pass, on two gloo ranks (one rank's
    estimate: tests/test_training.py)."""
    from benchmarks.prediction import eval_probe

    result = eval_probe.run(quick=True)
    assert [(r["num_workers"], r["eval_batch"]) for r in result["rows"]] == [(2, 16)]
    for row in result["rows"]:
        assert len(row["rounds"]) == 1 and row["whole_s"] > 0
        assert _finite(row["estimate_ratio"], row["scaled_ratio"])
        assert 0 < row["estimate_ratio"] < 5 and 0 < row["scaled_ratio"] < 10
    markdown = (RESULTS_DIR / "eval_probe_quick.md").read_text()
    assert len(_table_rows(markdown, "| workload | N | eval batch |")) == 1


def test_memory_benchmarks_record_an_out_of_memory_as_does_not_fit(monkeypatch):
    """A CUDA OOM in the memory benchmarks is a measurement ("does not fit"), not a crash
    (issue 14, GPU review item 8). No GPU here: the peak measurement raises torch's
    OutOfMemoryError above b = 64, as a full device would."""
    import torch

    from benchmarks.prediction import memory_accuracy
    from tula_ray.training import measure

    real = measure.peak_memory_bytes

    def device_of_64(workload, local_batch, **kwargs):
        if local_batch > 64:
            raise torch.OutOfMemoryError(f"CUDA out of memory at b={local_batch} (injected)")
        return real(workload, local_batch, **kwargs)

    monkeypatch.setattr(measure, "peak_memory_bytes", device_of_64)
    # A device large enough that only the OOM, never the limit, stops a batch.
    m = memory_accuracy._measure_model("fashion-mnist-cnn", [16, 64, 256], 2**40,
                                       torch.device("cpu"))
    rows = {row["local_batch"]: row for row in m["rows"]}
    assert rows[256]["peak_mem_bytes"] is None and rows[256]["rel_error"] is None
    assert rows[64]["peak_mem_bytes"] > rows[16]["peak_mem_bytes"] > 0
    assert m["max_local_batch"]["true"] == 64  # the largest b that ran
    for checked in m["max_local_batch"]["checked"].values():
        assert checked["bound"] <= 64
        assert any(c["peak_mem_bytes"] is None for c in checked["checks"])  # it tried above
    assert "out of memory" in memory_accuracy.report(
        {"models": {"cnn": m}, "declared_device_memory_bytes": 2**40, "headroom": 0.1,
         "command": "-", "commit": "-", "date": "-", "machine": "-", "load_avg_1min": [0, 0],
         "device": "cpu", "goal_median_rel_error": 0.05, "plot": "-"})


def _benchmarks_without_ray(*runs: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """`python -m benchmarks ARGUMENTS` for each ARGUMENTS of `runs`, all at once, where Ray
    (and kneed) cannot be imported, as on a plain PyTorch image: None in sys.modules makes
    their import fail."""
    processes = []
    try:
        for arguments in runs:
            code = ("import sys\nfor name in ('ray', 'kneed'):\n    sys.modules[name] = None\n"
                    f"sys.argv = ['benchmarks', *{list(arguments)!r}]\n"
                    "from benchmarks.__main__ import main\nmain()\n")
            processes.append(subprocess.Popen(
                [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, cwd=Path(__file__).parents[1]))
        outputs = [process.communicate(timeout=600) for process in processes]
        return [subprocess.CompletedProcess(process.args, process.returncode, *output)
                for process, output in zip(processes, outputs)]
    finally:
        for process in processes:
            if process.poll() is None:  # timed out, or the test failed starting another
                process.kill()
                process.wait()


# Its epochs against the profiled step (a ratio < 10) read 37.7 and 19.9 with the other
# xdist process's tests beside it: it runs alone, after the Ray tests (conftest).
@pytest.mark.alone
def test_gpu_acceptance_refuses_without_a_gpu_and_its_ray_free_half_runs_on_cpu():
    """Issue 26, item 7 (its Ray-free half): no GPU, no run, unless asked to use the CPU;
    then the environment, NCCL's absence, one rank's OOM in a synced step, the data path
    and one process's epochs against the profiled step, with no Ray to import. Both at once: the refusal is over within its imports."""
    refused, done = _benchmarks_without_ray(("gpu-acceptance", "--quick"),
                                            ("gpu-acceptance", "--quick", "--allow-cpu"))
    assert refused.returncode != 0 and "needs a CUDA GPU" in refused.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (RESULTS_DIR / "gpu_acceptance_quick.md").read_text()
    assert "Ray importable: False" in markdown and "`gather-host`" in markdown
    # Issue 46, item 3: no NCCL on the CPU, said so; one rank's OOM in a synced step ends
    # both gloo ranks within 30 s, both rows "oom".
    assert "- NCCL: version None, libnccl loaded: None (no CUDA)." in markdown
    assert "- A CUDA library's allocation failure (cuBLAS): not checked (no GPU)." in markdown
    (synced_oom,) = [line for line in markdown.splitlines()
                     if line.startswith("- One rank out of memory in a synced step (gloo ranks")]
    assert "rank 0: oom (PeerOutOfMemoryError); rank 1: oom (OutOfMemoryError)" in synced_oom
    assert float(re.search(r"both ranks ended ([\d.]+) s", synced_oom).group(1)) <= 30
    assert synced_oom.endswith("PASSED.")
    rows = _table_rows(markdown, "| workload | B |")
    assert [row[2] for row in rows] == ["fp32", "fp16"]  # fp16's loss-scaled step too
    for row in rows:
        predicted_over_fit = float(row[7])
        assert 0 < predicted_over_fit < 10  # a ratio of two measured times, both present
    # The probe's memory model against the training step's peak, nvidia-smi absent on CPU.
    memory_rows = _table_rows(markdown, "| workload | local batch b |")
    assert [int(row[1]) for row in memory_rows] == [128, 256]
    for row in memory_rows:
        assert float(row[2]) > 0 and float(row[3]) > 0 and row[5].startswith("not available")
    assert "the Ray-free half ran" in markdown and "Ray half: not run" in markdown


def test_noise_evolution_quick():
    """Issue 25's measurement along a run, smoke test: phi at steps 0, 25 and the epoch's end
    of a 1024-image CNN run, each from 4 pairs."""
    from benchmarks.accuracy import noise_evolution

    result = noise_evolution.run(quick=True)
    (points,) = result["traces"].values()
    assert [p["step"] for p in points] == [0, 25, 32] and points[-1]["last"]
    assert all(p["pairs"] == 4 and p["grad_var"] > 0 for p in points)
    markdown = (RESULTS_DIR / "noise_evolution_quick.md").read_text()
    assert len(_table_rows(markdown, "| workload | step |")) == 3


def test_online_noise_quick():
    from benchmarks.accuracy import online_noise

    result = online_noise.run(quick=True)
    settings = online_noise.QUICK
    assert [r["epoch"] for r in result["agreement"]] == list(settings["checkpoint_epochs"])
    for row in result["agreement"]:
        assert row["pairs"] == settings["online_samples"] // settings["pair_batch"]
        assert row["reference_pairs"] == settings["reference_pairs"]
        assert _finite(row["online"], row["reference"], row["ratio"])
        for name in ("online", "reference", "ratio"):
            assert row[f"{name}_low"] <= row[f"{name}_high"]
    for setup in ("N=1", "N=2"):
        for strategy in settings["cost_strategies"]:
            costs = result["costs"][setup][strategy]
            assert len(costs) == settings["blocks"] and _finite(*costs) and min(costs) > -1
    markdown = (RESULTS_DIR / "online_noise_quick.md").read_text()
    assert len(_table_rows(markdown, "| epoch |")) == len(settings["checkpoint_epochs"])
    assert len(_table_rows(markdown, "| setup |")) == 4


def test_equal_progress_quick():
    """Issue 25's Table I at equal progress, smoke test: the B = 32 reference for 1 epoch of
    512 images beside AGS-NS at B = 64 trained to that epoch's progress (1 or 2 epochs)."""
    from benchmarks.training import equal_progress

    result = equal_progress.run(quick=True)
    reference, ags_ns = result["rows"]
    assert reference["label"] == "reference" and reference["epochs_trained"] == 1
    assert ags_ns["global_batch"] == 64 and 1 <= ags_ns["epochs_trained"] <= 2
    assert ags_ns["progress_epochs"] >= 1.0 - 1e-9 and ags_ns["diverged"] == 0
    assert math.isfinite(ags_ns["gap_points"])
    markdown = (RESULTS_DIR / "equal_progress_quick.md").read_text()
    assert len(_table_rows(markdown, "| run | B |")) == 2


def test_strategy_extra_quick():
    """The strategy-extra benchmark, smoke test: 3 repeats of the profile's strategy phase
    on two gloo workers (no Ray), every layout of blocks estimated both ways."""
    from benchmarks.training import strategy_extra

    result = strategy_extra.run(quick=True)
    variants = result["variants"]
    layouts = strategy_extra.QUICK["layouts"]
    # The full run's first and last kinds of layout: the loop's blocks, and single steps.
    assert (layouts[0], layouts[-1]) == (strategy_extra.BLOCKS, strategy_extra.QUICK["steps"])
    assert {(v["blocks"], v["estimator"]) for v in variants} == {
        (blocks, estimator) for blocks in layouts for estimator in strategy_extra.ESTIMATORS}
    assert all(len(v["values_s"]) == 3 and all(map(math.isfinite, v["values_s"]))
               for v in variants)
    assert result["plain_step_s"] > 0 and math.isfinite(result["reference_s"])
    markdown = (RESULTS_DIR / "strategy_extra_quick.md").read_text()
    assert len(_table_rows(markdown, "| blocks | steps per block |")) == len(variants)


def test_time_to_accuracy_quick():
    """Issue 25's time-to-accuracy benchmark, smoke test: B = 32 and 128 on 512 images to
    two low targets, judged against a plan from synthetic profiles (no Ray)."""
    from benchmarks.accuracy import time_to_accuracy

    result = time_to_accuracy.run(quick=True)
    settings = time_to_accuracy.QUICK
    epoch_steps = settings["train_subset"] // 32  # of the reference run, at B = 32
    for target, judged in result["targets"].items():
        # the B = 32 runs reached it within the cap
        assert 0 < judged["e0"] <= settings["max_epochs"], target
        assert {r["global_batch"] for r in judged["rows"]} == {32, 128}
        assert set(judged["choices"]) == {"time_to_accuracy", "time", "knee"}
        assert all(c["regret"] >= 0 for c in judged["choices"].values())
        assert math.isfinite(judged["median_log_error"])
        assert judged["fitted_noise_scale"] > 0  # from B = 128's measured epochs
        assert judged["clock"] == "train_seconds"  # the goals' clock: what `train` waits
        assert all(math.isfinite(r["measured_s"]) and r["loop_s"] > 0 for r in judged["rows"])
        assert set(result["loop_targets"][target]["choices"]) == set(judged["choices"])
        assert result["searches"][0]["targets"][target]["global_batch"] == \
            judged["choices"]["time_to_accuracy"]["global_batch"]
    # phi measured at each target's step of the reference run re-makes the plan
    at = result["at_target"]
    assert set(at["phi"]) == set(at["iterate_phi"]) == set(result["targets"])
    for target, phi in at["iterate_phi"].items():
        assert len(phi["seeds"]) == 3 and phi["noise_scale"] > 0 and phi["steps"] == 0
        assert phi["step"] == math.ceil(result["targets"][target]["e0"] * epoch_steps)
        window = at["phi"][target]  # over an epoch (its steps) from half of it before S0
        assert window["steps"] == epoch_steps and window["step"] <= phi["step"]
        assert window["seeds"]
    assert set(at["searches"][0]["targets"]) == set(result["targets"])
    assert set(at["iterate_searches"][0]["targets"]) == set(result["targets"])
    markdown = (RESULTS_DIR / "time_to_accuracy_quick.md").read_text()
    assert len(_table_rows(markdown, "| B | predicted epochs |")) == 2  # the first target's
    assert len(_table_rows(markdown, "| search | phi |")) == 1  # one search in --quick
    assert markdown.count("| search |") == 3  # and re-made at the targets' phi, twice
    assert f"tula_ray.measure_noise_scale(workload, model, steps={epoch_steps})" in markdown


def test_time_to_accuracy_holds_out_images_it_never_trains_on():
    """The ground truth trains on the subset a search of it profiles (the first k images)
    and scores the next ones: disjoint, the test set untouched."""
    from benchmarks.accuracy.time_to_accuracy_runs import held_out_workload
    from tula_ray.workloads.datasets import fashion_mnist

    workload = held_out_workload(train_subset=100, held_out=50)
    train, held = workload.train_dataset_fn(), workload.test_dataset_fn()
    assert (len(train), len(held), workload.dataset_size) == (100, 50, 100)
    images, _ = fashion_mnist(train=True).tensors
    assert torch.equal(train.tensors[0], images[:100])
    assert torch.equal(held.tensors[0], images[100:150])


def test_time_to_accuracy_on_trains_clock():
    """Measured epochs to a target x (whole steps of the training split at `train`'s step
    + the loop's median evaluation); NaN at a B that `train` did not time."""
    from benchmarks.accuracy.time_to_accuracy_runs import on_train_clock, whole_steps

    assert whole_steps(8000, 2048) == 3 and whole_steps(8000, 32) == 250
    truth = {32: {"epochs": 1.5, "seconds": 9.0}, 64: {"epochs": 2.0, "seconds": 9.0}}
    runs = [{"global_batch": 32, "history": [{"eval_seconds": 0.4}, {"eval_seconds": 0.2},
                                            {"eval_seconds": 0.3}]},
            {"global_batch": 64, "history": [{"eval_seconds": 0.3}]}]
    on_train_clock(truth, runs, {32: {"step_s": 0.02}}, train_size=8000)
    assert truth[32]["train_seconds"] == pytest.approx(1.5 * (250 * 0.02 + 0.3))
    assert math.isnan(truth[64]["train_seconds"])


def test_time_to_accuracy_pools_the_traced_phi_near_a_target():
    """phi at a target's step: the |G|^2 and tr(Sigma) of the trace's points within the
    window, weighted by their pairs, then their ratio (not a mean of the points' ratios)."""
    from benchmarks.accuracy.time_to_accuracy_at_target import phi_near

    trace = [{"step": 100, "grad_sqr": 1.0, "grad_var": 100.0, "pairs": 32},
             {"step": 200, "grad_sqr": 3.0, "grad_var": 100.0, "pairs": 32},
             {"step": 290, "grad_sqr": 0.5, "grad_var": 200.0, "pairs": 64},
             {"step": 900, "grad_sqr": 0.01, "grad_var": 500.0, "pairs": 32}]
    near = phi_near(trace, 220.0, window=100)
    assert (near["points"], near["pairs"]) == (2, 96)
    assert near["noise_scale"] == pytest.approx((32 * 100 + 64 * 200) / (32 * 3.0 + 64 * 0.5))
    with pytest.raises(ValueError, match="no point within 10 steps of step 500"):
        phi_near(trace, 500.0, window=10)


def test_profiling_wall_checks_out_an_earlier_commit_and_removes_it():
    from benchmarks.startup.profiling_wall import REPO, checkout, commit_of

    with checkout("HEAD") as tree:
        assert commit_of(tree) == commit_of(REPO)
        assert (tree / "tula_ray" / "cli" / "__main__.py").is_file()
    assert not tree.exists()


def test_train_time_keeps_bf16_out_of_the_fp32_goal_and_sets_it_beside_fp32():
    from benchmarks.prediction.train_time_compare import precision_ratios, summary

    def row(workload, predicted, measured):
        return {"workload": workload, "num_workers": 2, "global_batch": 128,
                "predicted_s": predicted, "measured_s": measured,
                "ratio": predicted / measured}

    rows = [row("fashion-mnist-cnn", 10.0, 8.0), row("fashion-mnist-cnn-bf16", 5.0, 6.0),
            row("demo0", 9.0, 10.0)]
    figures = summary(rows)
    assert figures["median_abs_error"] == figures["worst_abs_error"] == pytest.approx(0.25)
    assert figures["bf16_abs_errors"] == [pytest.approx(1 / 6)]
    assert figures["demo_abs_errors"] == [pytest.approx(0.1)]
    (ratio,) = precision_ratios(rows)
    assert (ratio["predicted"], ratio["measured"]) == (pytest.approx(0.5), pytest.approx(0.75))


def test_train_time_sets_each_search_beside_the_runs_and_the_plans_spread():
    import pandas as pd

    from benchmarks.prediction.train_time_compare import add_plan_spread, compare, each_search

    class FakePlan:  # the two parts of a Plan the comparison reads
        def __init__(self, epoch_s):
            self.table = pd.DataFrame({"num_workers": [1], "global_batch": [32],
                                       "estimate": ["measured"], "epoch_time_s": [epoch_s],
                                       "measured_epoch_time_s": [epoch_s],
                                       "eval_time_s": [1.0]})
            self.profiles = pd.DataFrame()

    def run(repeat, seconds):
        return {"workload": "user-cnn", "num_workers": 1, "global_batch": 32,
                "repeat": repeat, "epoch_seconds": [99.0, seconds, seconds],
                "eval_seconds": [1.0, 1.0, 1.0]}

    searches = [{"user-cnn": FakePlan(10.0)}, {"user-cnn": FakePlan(12.0)}]
    runs = [run(0, 10.0), run(1, 12.0)]
    (row,) = compare(searches[0], [], runs)
    assert row["measured_s"] == pytest.approx(11.0) and row["repeats"] == 2
    add_plan_spread([row], searches)
    assert row["plans_predicted_s"] == [10.0, 12.0]
    assert row["plans_spread"] == pytest.approx(2 / 11)
    assert row["median_plan_ratio"] == pytest.approx(1.0)
    first, second = each_search(searches, runs)
    assert first["all_runs"]["median_abs_error"] == pytest.approx(1 / 11)
    assert second["all_runs"]["median_abs_error"] == pytest.approx(1 / 11)
    # Against the run that followed it, each plan was exact.
    assert first["its_runs"]["median_abs_error"] == pytest.approx(0.0)
    assert second["its_runs"]["median_abs_error"] == pytest.approx(0.0)


def test_own_model_quick():
    """Issue 41's acceptance benchmark, smoke test: its workload (integer tokens in a custom
    Dataset, Adam) learns in a plain loop; the Ray parts run in the full benchmark only."""
    from benchmarks.startup import own_model

    result = own_model.run(quick=True)
    (accuracy,) = result["plain_loop"]
    assert 0.3 < accuracy <= 1.0  # above chance (4 classes) after one epoch
    markdown = (RESULTS_DIR / "own_model_quick.md").read_text()
    assert "Plain Adam loop at B = 32" in markdown


def test_profile_agreement_sets_each_candidate_of_the_two_trees_side_by_side():
    """The side-by-side summary and report of issue 42's refactor check, on made-up runs
    (the runs themselves need Ray: tests/test_benchmarks_profile_agreement.py)."""
    from benchmarks.startup.profile_agreement import report, summary

    def run(tree, index, step_s, compute_s, extra_rows=()):
        rows = [{"num_workers": 1, "global_batch": 32, "step_time_s": step_s,
                 "compute_time_s": compute_s}, *extra_rows]
        return {"tree": tree, "index": index, "rows": rows}

    runs = [run("this", 0, 0.100, 0.080), run("this", 1, 0.104, 0.081),
            run("this", 2, 0.102, 0.079),
            run("dec29af", 0, 0.101, 0.090), run("dec29af", 1, 0.103, 0.091),
            run("dec29af", 2, 0.105, 0.092,
                [{"num_workers": 2, "global_batch": 64, "step_time_s": 0.2,
                  "compute_time_s": 0.1}])]
    figures = summary(runs)
    assert figures["trees"] == ["this", "dec29af"]
    assert figures["only_one_tree"] == [[2, 64]]
    (candidate,) = figures["candidates"]
    assert candidate["step_time_s"]["this"] == {"median": 0.102, "min": 0.100, "max": 0.104,
                                                "runs": 3}
    # step: 0.102 against 0.103, within the wider range (0.004); compute: 0.080 against
    # 0.091, outside both ranges (0.002)
    assert candidate["agree"] == {"step_time_s": True, "compute_time_s": False}
    assert figures["all_agree"] is False
    one_run = summary([run("this", 0, 0.1, 0.08), run("dec29af", 0, 0.2, 0.1)])
    assert one_run["candidates"][0]["agree"]["step_time_s"] is None  # no spread: no verdict
    assert one_run["all_agree"] is None
    provenance = {"command": "python -m benchmarks profile-agreement", "commit": "abc",
                  "date": "today", "machine": "here"}
    markdown = report({"provenance": provenance, "commits": {"this": "abc",
                                                             "dec29af": "dec29af"},
                       "runs": runs, **figures})
    (row,) = _table_rows(markdown, "| N | B |")
    assert row[:2] == ["1", "32"] and row[2] == "102.0 (100.0-104.0)" and row[4] == "yes"
    assert row[-1] == "no" and "N=2 B=64" in markdown


def test_gpu_acceptance_reports_nccls_version_and_the_libnccl_mapped(monkeypatch):
    """Issue 46, item 3, on a GPU (faked here): torch's NCCL version, then the libnccl
    files this process mapped, read from /proc/self/maps as the node check reads them."""
    from pathlib import Path

    from benchmarks.gpu.acceptance import nccl_library
    from tula_ray.distributed import loaded_libraries

    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    facts = nccl_library(torch.device("cuda"))
    assert facts == {"nccl_version": "2.27.3",
                     "libnccl": loaded_libraries(Path("/proc/self/maps").read_text())}
    assert nccl_library(torch.device("cpu")) == {"nccl_version": None, "libnccl": None,
                                                 "nccl_why_none": "no CUDA"}


def test_host_allocator_quick():
    """Issue 43's allocator benchmark, smoke test: one fresh process per arm at B = 32,
    each with the allocator it was given, its profiled step and its epochs' steps."""
    from benchmarks.training import host_allocator

    result = host_allocator.run(quick=True)
    runs = result["runs"]
    assert sorted((r["arm"], r["allocator"]) for r in runs) == [("default", "default"),
                                                                 ("steady", "steady")]
    for r in runs:
        assert r["batch"] == 32 and r["profile_step_s"] > 0
        assert len(r["epoch_step_s"]) == host_allocator.EPOCHS and min(r["epoch_step_s"]) > 0
    markdown = (RESULTS_DIR / "host_allocator_quick.md").read_text()
    assert "| 32 | steady |" in markdown and "| 32 | default |" in markdown
    assert "- steady: median |profile / train - 1|" in markdown
