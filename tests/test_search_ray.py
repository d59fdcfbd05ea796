"""tula_ray.search() on local Ray, with a Workload defined here as a user would: own model,
own data (3-channel 16 x 16 images, no sample_shape or num_classes given). Full and adaptive
search (the partial search is the adaptive one's first round), OOM handling, a worker
killed, bad input, restoring the searcher, and the benchmarks' smoke tests on the plans.
`tula_ray.train` with a user's Workload is README's driver (tests/test_docs.py).
"""

import dataclasses
import os
import signal
import sys

import numpy as np
import pytest
import torch
from ray import cloudpickle  # Ray serialises functions with its own copy
from torch import nn
from torch.utils.data import TensorDataset

from result_checks import finite, table_rows, summary_words

import tula_ray
from benchmarks.common import RESULTS_DIR
from tula_ray.training import measure
from tula_ray.models import perf
from tula_ray.models import memory as memory_model
from tula_ray.profile_table import usable
from tula_ray.space import SearchSpace
from tula_ray.planning.search_strategies import make_search_strategy
from tula_ray.training.strategies import TRAINING_STRATEGY_DEFAULT
from tula_ray.workloads.check import checked
from tula_ray.workloads import Workload

pytestmark = pytest.mark.ray

# Ray workers cannot import this test module: its functions travel by value, as a
# driver script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])



def user_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 5))


def user_images(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn((count, 3, 16, 16), generator=generator),
                         torch.randint(0, 5, (count,), generator=generator))


def user_train_data() -> TensorDataset:
    return user_images(1024, seed=0)


def user_test_data() -> TensorDataset:
    return user_images(256, seed=1)


USER_WORKLOAD = Workload("user-rgb-cnn", user_model, user_train_data, user_test_data, epochs=3)
WORKLOAD = dict(workload=USER_WORKLOAD)


class DiesOnLargeBatches(nn.Module):
    """Rank 1 of a two-worker group SIGKILLs its own process in its first training forward
    of a local batch >= 128: a real worker lost in the middle of its group's sweep (after
    B = 32 and 64 were measured), at a known point. A killer thread polling for the
    N = 2 trial's files raced Tune's writing of them (in the full suite, once, it never
    fired)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if (self.training and inputs.shape[0] >= 128 and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() == 2
                and torch.distributed.get_rank() == 1):
            os.kill(os.getpid(), signal.SIGKILL)
        return inputs


def user_model_dying_on_large_batches() -> nn.Module:
    return nn.Sequential(DiesOnLargeBatches(), user_model())


QUICK = dict(warmup_steps=2, measure_steps=5, measure_seconds=0.5, min_batch=32, max_batch=128)


@pytest.fixture(scope="module")
def full_plan(readme_driver):
    """README's driver's search (run once for the run: conftest.py's `readme_driver`): the
    user's own Workload over N in {1, 2} and B in {32, 64, 128}, every candidate measured
    (partial search's corners and the middle batch between them are all of this grid)."""
    plan = readme_driver["namespace"]["plan"]
    assert sorted(set(plan.table["global_batch"])) == [32, 64, 128], (
        "README's driver searches another grid: update this module's expectations")
    return plan


@pytest.fixture(scope="module")
def adaptive_plan(ray_session, tmp_path_factory):
    """Rounds through Tune: the corners first (the paper's partial search, whose
    off-corner cells are predicted), then the choice and its ties. Which rows the
    partial search profiles, and when it stops, is the strategy's own (test_searcher)."""
    return tula_ray.search(**WORKLOAD, **QUICK, cluster_sizes=(1, 2), search_strategy="adaptive",
                           strategy_options={"max_rounds": 2, "max_launches": 3},
                           objective="knee", epochs=2,
                           storage_path=str(tmp_path_factory.mktemp("adaptive")))


def test_adaptive_search_measures_its_choice_or_says_why_not(adaptive_plan):
    """Corners first, then the choice and its ties; the plan says why the search stopped
    and how sure it is of every row."""
    meta, table = adaptive_plan.meta, adaptive_plan.table
    assert 1 <= meta["rounds"] <= 2 and meta["launches"] <= min(3, 2 * meta["rounds"])
    chosen = adaptive_plan.chosen
    if "is measured and no unmeasured candidate ties it" in meta["stop_reason"]:
        assert chosen["source"] == "measured"
    else:
        assert "budget spent" in meta["stop_reason"] or "every" in meta["stop_reason"]
    assert "search stopped:" in summary_words(adaptive_plan)
    # Its first round is the partial search's: the corners (and the middle batch between
    # them), one worker group per N.
    first = [sweep for sweep in meta["sweeps"] if sweep["round"] == 1]
    assert {(1, 32), (1, 128), (2, 32), (2, 128)} <= {
        (sweep["num_workers"], b) for sweep in first for b in sweep["global_batches"]}
    assert len(first) == 2
    measured = table[table["source"] == "measured"]
    assert measured["rel_uncertainty"].ge(0).all() and table["rel_uncertainty"].notna().all()
    assert (table["total_time_low_s"] <= table["total_time_s"]).all()
    assert (table["total_time_s"] <= table["total_time_high_s"]).all()


def test_the_adaptive_search_predicts_every_candidate_it_did_not_measure(adaptive_plan):
    table = adaptive_plan.table
    assert len(table) == 6
    assert table["step_time_s"].gt(0).all() and table["total_time_s"].gt(0).all()
    measured = table[table["source"] == "measured"]
    assert {(1, 32), (1, 128), (2, 32), (2, 128)} <= set(
        zip(measured["num_workers"], measured["global_batch"]))
    assert measured["measured_step_time_s"].gt(0).all()
    assert (measured["status"] == "ok").all()
    # The all-reduce of this small CNN is within step noise: only consistency is asserted.
    assert np.allclose(measured["measured_sync_time_s"], measured["measured_step_time_s"]
                       - measured["measured_compute_time_s"])
    assert measured["measured_sync_time_s"].ge(0).all()
    assert measured.loc[measured["num_workers"] == 1, "measured_sync_time_s"].eq(0).all()
    assert adaptive_plan.choice.objective == "knee"
    assert adaptive_plan.epochs == 2  # search(epochs=...) over the workload's 3


def test_the_plan_says_what_the_search_cost_and_no_checkpoint_probe_is_left(adaptive_plan):
    """Issue 45: the launches' and the memory probe's node-hours, in the plan and its
    summary; the profiled checkpoints' uploads to the storage path are removed."""
    from pathlib import Path

    from tula_ray.training.epoch_costs import CHECKPOINT_PROBE_PREFIX

    meta = adaptive_plan.meta
    cost = meta["search_cost"]
    assert sum(entry["launches"] for entry in cost["by_num_workers"]) == meta["launches"]
    assert cost["probe"]["seconds"] == pytest.approx(meta["probe_wall_s"])
    assert cost["node_hours"] > cost["probe"]["node_hours"] > 0
    assert "the search: " in summary_words(adaptive_plan)
    storage = Path(meta["experiment_path"]).parent
    assert storage.is_dir() and not list(storage.glob(f"{CHECKPOINT_PROBE_PREFIX}*"))


def test_a_search_of_every_candidate_measures_them_in_one_group_per_n(full_plan):
    table = full_plan.table
    assert len(table) == 6 and (table["source"] == "measured").all()
    assert full_plan.meta["launches"] == 2  # 6 candidates, one worker group per N
    assert table["measured_step_time_s"].gt(0).all()
    # Every candidate measured: the choice is the best by its measurement, not the model.
    assert (table["estimate"] == "measured").all()
    assert table["estimated_total_time_s"].equals(table["measured_total_time_s"])
    best = table.loc[table["measured_total_time_s"].idxmin()]
    choice = full_plan.choice
    # The best by its measurement, or the candidate the tie-break's rule took among those
    # tied with it (the best among them).
    assert (best["num_workers"], best["global_batch"]) in {
        (choice.num_workers, choice.global_batch), *choice.ties}
    assert "figures are measured" in choice.reason


# The same step timed minutes apart drifts by about this much on a shared machine (the
# other tenants' load moves): a cell's own spread, measured over seconds, does not see it.
# 0.15 (NOTES-ENV's ~15 %) was passed by 0.351 against 0.308 in a full run of the suite
# on 2026-11-28; the profile-agreement benchmark's demos minutes apart differ by up to
# 32 % in a cell's median (benchmarks/results/profile_agreement.md). The wrong model
# below is off by several times its step, far past either bound.
LOAD_DRIFT = 0.30


def _off_corner_errors(profiles, params):
    """Relative step-time errors of `params` on the usable rows the partial fit did not see,
    and each cell's bound: its own measured spread plus the largest of its N's corners
    (spread = interquartile range / median of the synced steps, within the worker group),
    plus the load's drift between the cells' measurements."""
    rows = usable(profiles)
    corners = make_search_strategy("partial", {"middle": False}).fit_rows(profiles)
    seen = set(zip(corners["num_workers"], corners["global_batch"]))
    off = rows[[(n, b) not in seen for n, b in zip(rows["num_workers"], rows["global_batch"])]]
    predicted = perf.predict_step_s(params, off["num_workers"], off["local_batch"])
    error = np.abs(predicted - off["step_time_s"]) / off["step_time_s"]
    corner_spread = corners.groupby("num_workers")["step_time_spread"].max()
    bound = (off["step_time_spread"].to_numpy() + corner_spread[off["num_workers"]].to_numpy()
             + LOAD_DRIFT)
    return error.to_numpy(), bound


def test_partial_fit_predicts_the_cells_it_did_not_see(full_plan):
    """The partial model, fitted on the full search's own corner rows (each N's batches come
    from one worker group, so no between-process noise), predicts the off-corner cells
    within their measured spread; a model with the per-sample compute cost 10x too high
    fails the same check, so the bound is not vacuous (on a machine loaded well past its
    cores the spread of tiny steps exceeds 100 %: the wrong model must be far off)."""
    params = perf.fit(make_search_strategy("partial", {"middle": False}).fit_rows(full_plan.profiles))
    error, bound = _off_corner_errors(full_plan.profiles, params)
    assert len(error) == 2  # (1, 64) and (2, 64)
    assert (error <= bound).all(), (error, bound)
    wrong = dataclasses.replace(params, compute={
        n: dataclasses.replace(c, per_sample_s=10 * c.per_sample_s)
        for n, c in params.compute.items()})
    wrong_error, _ = _off_corner_errors(full_plan.profiles, wrong)
    assert (wrong_error > bound).any(), (wrong_error, bound)


def test_plan_round_trips_and_plots(adaptive_plan, tmp_path):
    again = tula_ray.Plan.from_json(adaptive_plan.to_json(tmp_path / "plan.json"))
    assert again.choice == adaptive_plan.choice
    assert all(p.stat().st_size > 0 for p in again.plot(tmp_path))


def _peaks(*local_batches):
    workload = checked(USER_WORKLOAD)
    return [measure.peak_memory_bytes(workload, b, device="cpu") for b in local_batches]


def _optimistic(probe_memory):
    """The memory probe, with a per-sample slope 4x too small (like a probe whose small
    batches sit where the optimizer step's peak dominates)."""
    def optimistic_probe(*args, **kwargs):
        probe = probe_memory(*args, **kwargs)
        params = probe.params
        probe.params = dataclasses.replace(
            params, activation_bytes_per_sample=params.activation_bytes_per_sample / 4)
        return probe
    return optimistic_probe


def test_the_bound_check_catches_an_optimistic_memory_model(ray_session):
    """The check measures the predicted bound on a worker and pulls it back under the device."""
    from trainables.memory_probe import check_max_local_batch, probe_memory

    low, high = _peaks(64, 128)
    device = (low + high) / 2
    probe = _optimistic(probe_memory)(USER_WORKLOAD, {}, min_local_batch=16,
                                      resources={"CPU": 1.0}, use_gpu=False)
    assert memory_model.max_local_batch(probe.params, device, 0.0) >= 128  # overshoots
    candidates = SearchSpace.build((1, 2), min_batch=32, max_batch=128)  # local b <= 128
    bounded = check_max_local_batch(probe, device, headroom=0.0, space=candidates,
                                    resources={"CPU": 1.0}, use_gpu=False)
    first = bounded.bound_checks[0]
    assert first["local_batch"] == 128 and first["peak_mem_bytes"] > device  # the cap, measured
    bound = bounded.max_local_batch
    assert 64 < bound < 128 and _peaks(bound)[0] <= device
    assert [row["bound_check"] for row in bounded.rows] == (
        [False] * 3 + [True] * len([c for c in bounded.bound_checks if c["peak_mem_bytes"]]))
    # The refit on every measured peak predicts the checked batches' peaks closely.
    for row in bounded.rows:
        assert row["predicted_peak_mem_bytes"] == pytest.approx(row["peak_mem_bytes"], rel=0.05)


def test_a_profiling_worker_killed_mid_trial_is_an_error_row_and_the_search_finishes(
        ray_session, tmp_path):
    """Issue 13, item 3: a real worker process is killed while its group profiles N = 2;
    the candidates it had not measured are error rows (infeasible in the plan), and the
    search finishes and chooses among what was measured."""
    plan = tula_ray.search(workload=dataclasses.replace(
                               USER_WORKLOAD, model_fn=user_model_dying_on_large_batches),
                           warmup_steps=2, measure_steps=5, measure_seconds=1.0,
                           min_batch=32, max_batch=256, cluster_sizes=(2,),
                           search_strategy="full", objective="time", storage_path=str(tmp_path))
    rows = plan.profiles.set_index(["num_workers", "global_batch"])
    assert (rows.loc[[(2, 32), (2, 64)], "status"] == "ok").all()  # measured before the kill
    errors = rows[rows["status"] == "error"]
    # What the lost worker had left, B = 128 and 256, and perhaps a row it had measured
    # but whose report Ray Train had not collected yet when the worker died.
    assert set(errors.index.get_level_values(0)) == {2}
    assert {(2, 128), (2, 256)} <= set(errors.index)
    assert (errors["failure"] == "infrastructure").all()  # a lost worker: the search goes on
    # Each distinct error once, with the candidates it hit (not once per candidate).
    named = [entry["error"] for entry in plan.meta["errors"]]
    assert len(named) == len(set(named)) == errors["error"].nunique()
    assert sum(len(entry["candidates"]) for entry in plan.meta["errors"]) == len(errors)
    assert "errors while profiling, each once" in summary_words(plan)
    table = plan.table.set_index(["num_workers", "global_batch"])
    assert (table.loc[errors.index, "infeasible_reason"] == "profiling crashed").all()
    assert rows.loc[(plan.choice.num_workers, plan.choice.global_batch), "status"] == "ok"


@pytest.mark.parametrize("kwargs, message", [
    (dict(workload="imagenet-vit"), "workload 'imagenet-vit' is unknown"),
    (dict(cluster_sizes=(1, 4)), "cluster size 4 is larger than the cluster's 2 CPUs"),
    (dict(objective="fastest"), "objective='fastest' is not allowed"),
    (dict(search_strategy="half"), "search_strategy='half' is not allowed"),
    (dict(min_batch=0), "min_batch=0; it must be an integer >= 1"),
    (dict(min_batch=64, max_batch=32), "max_batch=32 is below min_batch=64"),
    # 1 kB cannot even hold DDP's gradient buckets; 5 MB holds the model, not 16 samples.
    (dict(device_memory_gb=1e-6), "nothing is left for training on a device of 1e-06 GB"),
    (dict(device_memory_gb=0.005), "min_batch=32 does not fit"),
    # Issue 46: evaluating 8192 samples needs ~0.29 GB; 0.05 GB holds training at b <= ~700.
    (dict(workload=dataclasses.replace(USER_WORKLOAD, eval_batch=8192), workload_options=None,
          device_memory_gb=0.05), "eval_batch=8192 does not fit: evaluating one batch"),
    (dict(epochs=0), "epochs=0"),
    (dict(workload=dataclasses.replace(USER_WORKLOAD, sample_shape=(1, 28, 28)),
          workload_options=None), r"sample_shape=\(1, 28, 28\)"),
    (dict(workload=dataclasses.replace(USER_WORKLOAD, num_classes=7), workload_options=None),
     "num_classes=7, but the model outputs 5"),
])
def test_bad_input_fails_before_any_trial(ray_session, tmp_path, kwargs, message):
    options = {"workload": "fashion-mnist-cnn", "workload_options": {"train_subset": 2048},
               "cluster_sizes": (1, 2), "storage_path": str(tmp_path), **kwargs}
    with pytest.raises(ValueError, match=message):
        tula_ray.search(**options)
    assert not list(tmp_path.iterdir())  # no Tune experiment was started


def test_the_users_workload_is_completed_from_its_data(adaptive_plan):
    """No sample_shape or num_classes was given: the memory probe ran on the data's shape."""
    assert adaptive_plan.workload == "user-rgb-cnn"
    assert adaptive_plan.memory is not None
    assert adaptive_plan.table["peak_mem_bytes"].gt(0).all()


def test_the_searcher_state_is_json_and_a_restored_searcher_repeats_nothing(full_plan, tmp_path):
    """Tune saved the searcher at its experiment checkpoints (the Workload is in the param
    space, not in the searcher's state); a searcher restored from them is done."""
    from ray.tune.search import Searcher

    from searchers import TulaSearcher

    experiment = full_plan.meta["experiment_path"]
    restored = TulaSearcher([tula_ray.Candidate(1, 32)], "partial")  # state from the files
    restored.restore_from_dir(str(experiment))
    assert len(restored.profiles) == len(full_plan.table)
    assert restored.suggest("again") == Searcher.FINISHED


def test_prediction_benchmark_quick_on_the_full_search(full_plan):
    """The prediction benchmark's smoke test (issue 5), on this module's full search."""
    from benchmarks.prediction import prediction

    result = prediction.run(quick=True, full_plans={full_plan.workload: full_plan})
    assert {"command", "commit", "date", "machine", "workloads", "load_avg_1min"} <= set(result)
    assert set(result["workloads"]) == {full_plan.workload}
    markdown = (RESULTS_DIR / "prediction_quick.md").read_text()
    for name, w in result["workloads"].items():
        assert (RESULTS_DIR / w["plot"]).stat().st_size > 0
        saved = tula_ray.Plan.from_json(RESULTS_DIR / w["plan_json"])
        assert saved.table[["num_workers", "global_batch"]].equals(
            full_plan.table[["num_workers", "global_batch"]])
        candidates = {(c["num_workers"], c["global_batch"]) for c in w["per_candidate"]}
        assert candidates == {(n, b) for n in prediction.SEARCH["cluster_sizes"]
                              for b in w["batch_sizes"]}  # one row per candidate, all measured
        for c in w["per_candidate"]:
            assert finite(c["measured_step_time_s"], c["step_time_s_full"],
                           c["step_time_s_partial"], c["measured_total_time_s"],
                           c["total_time_s_full"], c["total_time_s_partial"],
                           c["full_rel_error"], c["partial_rel_error"])
            assert c["measured_step_time_s"] > 0 and c["step_time_s_partial"] > 0
        for model in ("full", "partial"):
            a = w["accuracy"][model]
            assert finite(a["median_rel_error"], a["max_rel_error"])
            assert 0 <= a["median_rel_error"] <= a["max_rel_error"]
        assert finite(w["accuracy"]["full"]["loo_median_rel_error"])
        assert len(w["selection"]) == len(prediction.OBJECTIVES) * len(prediction.PRICINGS)
        for s in w["selection"]:
            assert (s["oracle"]["num_workers"], s["oracle"]["global_batch"]) in candidates
            assert finite(s["oracle"]["measured"], s["partial_regret"], s["full_regret"],
                          s["adaptive_regret"])
            if s["objective"] != "knee":  # the oracle minimises the metric; a knee does not
                assert s["partial_regret"] >= 0 and s["full_regret"] >= 0
        cost = w["search_cost"]["full"]
        assert cost["trials"] == full_plan.meta["launches"] and finite(cost["profiling_wall_s"])
        assert len(table_rows(markdown, "| N | B | measured step")) == len(candidates)
        assert len(table_rows(markdown, "| objective | pricing |")) == len(w["selection"])


def test_search_cost_benchmark_quick_on_this_modules_searches(full_plan, adaptive_plan):
    """The demo benchmark's smoke test (issue 11), on this module's searches: its
    plumbing (the full search's plan stands in for the partial runs it reads)."""
    from benchmarks.prediction import search_cost

    result = search_cost.run(quick=True, plans={"partial": [full_plan, full_plan],
                                                "adaptive": [adaptive_plan]})
    runs = result["runs"]
    assert [len(runs["partial"]), len(runs["adaptive"])] == [2, 1]
    first = runs["partial"][0]
    assert first["wall_s"] is None and first["launches"] == 2  # one group per N
    assert first["choice"] == [full_plan.choice.num_workers, full_plan.choice.global_batch]
    assert finite(first["profiling_wall_s"], first["probe_wall_s"])
    assert result["consistency"]["partial"]["same_choice"]  # the same plan twice
    markdown = (RESULTS_DIR / "search_cost_quick.md").read_text()
    assert len(table_rows(markdown, "| strategy | run |")) == 3
    assert len(table_rows(markdown, "| strategy | same choice")) == 2


def test_the_plan_includes_the_training_strategys_measured_cost(full_plan):
    """Issue 14, item 7: each worker group times train's default strategy once;
    the plan adds what it measured to every step, and says so."""
    profiles = full_plan.profiles
    assert profiles["strategy_extra_s"].notna().sum() == len(full_plan.meta["sweeps"])
    assert full_plan.meta["training_strategy"] == TRAINING_STRATEGY_DEFAULT
    assert (f"include {TRAINING_STRATEGY_DEFAULT}'s measured cost per step"
            in summary_words(full_plan))
    table = full_plan.table
    # Issue 24: whole steps as train takes them, and the epoch's measured other costs.
    steps = np.floor(full_plan.dataset_size / table["global_batch"])
    assert (table["eval_time_s"] > 0).all() and (table["checkpoint_time_s"] > 0).all()
    assert (table["startup_time_s"] > 0).all()
    # The start-up is each launch's whole time beyond its candidates: more than its start.
    ok = profiles[profiles["status"] == "ok"]
    assert (ok["launch_fixed_s"] > ok["launch_wall_s"]).all()
    # ... plus the workload's check on a worker, which `train` runs before its launch.
    assert full_plan.meta["workload_check_s"] > 0
    assert (table["startup_time_s"] > ok["launch_fixed_s"].min()).all()

    def total(step_s):
        epoch = steps * (step_s + table["strategy_extra_s"])
        return (full_plan.epochs * (epoch + table["eval_time_s"] + table["checkpoint_time_s"])
                + table["startup_time_s"]).to_numpy()

    assert table["epoch_time_s"].to_numpy() == pytest.approx(
        (steps * (table["step_time_s"] + table["strategy_extra_s"])).to_numpy())
    assert table["total_time_s"].to_numpy() == pytest.approx(total(table["step_time_s"]))
    step = table["measured_step_time_s"].where(table["estimate"] == "measured",
                                               table["step_time_s"])
    assert table["estimated_total_time_s"].to_numpy() == pytest.approx(total(step))  # policy's
