"""The profiling trainable on a real local Ray: Tune trial -> ONE TorchTrainer per cluster
size -> workers -> one row (one Tune result) per global batch."""

from __future__ import annotations

import math

import pytest

ray = pytest.importorskip("ray")
import sys  # noqa: E402

from ray import cloudpickle, tune  # noqa: E402

from trainables.profiling_trial import profile_cluster_size  # noqa: E402
from tula_ray.cluster import trial_resources, worker_shape  # noqa: E402
from tula_ray.training import measure  # noqa: E402
from tula_ray.profile_table import (LAUNCH_TOTAL_KEY, PROFILE_COLUMNS,  # noqa: E402
                                    profile_frame, profile_row)
from tula_ray.workloads import get_workload  # noqa: E402
import text_workload  # noqa: E402
from text_workload import TEXT_WORKLOAD  # noqa: E402

pytestmark = pytest.mark.ray
# workers cannot import tests/
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(text_workload)

BASE = {"workload": "fashion-mnist-cnn", "workload_options": {"data": "fake", "fake_size": 512},
        "warmup_steps": 3, "measure_steps": 10}


_FAKE = get_workload("fashion-mnist-cnn-fake")
# Between the peaks at b = 16 and b = 32: 16 fits, 32 does not.
_LIMIT = sum(measure.peak_memory_bytes(_FAKE, b, device="cpu") for b in (16, 32)) / 2

CASES = {  # name -> the trial's config on top of BASE
    # One worker group, two batches; and the training strategy's cost per step: the literal
    # ags refuses B = 32 at N = 1 (its small batch is 32), so it is measured at B = 64.
    "one": {"num_workers": 1, "global_batches": [32, 64], "training_strategy": "ags"},
    # A user's own map-style Dataset (the DataLoader path) of integer tokens, their
    # EmbeddingBag model and Adam, on two workers, with ags-ns around that Adam: it
    # registers a DDP comm hook (on its own copy of the model, so the sweep's next batch
    # is plain DDP again).
    "two": {"num_workers": 2, "global_batches": [32, 64], "workload": TEXT_WORKLOAD,
            "workload_options": None, "training_strategy": "ags-ns"},
    "oom": {"num_workers": 1, "global_batches": [64, 32, 16], "device_memory_bytes": _LIMIT},
    # Found without starting workers: no worker group is launched for these.
    "indivisible": {"num_workers": 2, "global_batches": [33]},
    "unknown": {"workload": "no-such-model"},
    "too-big": {"global_batches": [1024]},  # the fake dataset holds 512
}


def _case_trial(config: dict) -> None:
    """The profiling trainable on one case's config (lists such as global_batches do not go
    through Tune's variant generator)."""
    profile_cluster_size({"num_workers": 1, "global_batches": [64], **config,
                          **CASES[config["case"]]})


@pytest.fixture(scope="module")
def rows(ray_session, tmp_path_factory) -> dict[str, dict]:
    """Every case as a trial of ONE Tuner (a Tuner costs ~7 s on its own), on the run's
    shared Ray (2 CPUs, loopback; trials hold `train_driver` instead of a CPU); rows by
    case name. Three worker groups in all: one per case that can run."""
    space = {**BASE, "case": tune.grid_search(list(CASES))}
    tuner = tune.Tuner(
        # Concurrency is bounded by the 2 CPUs: the N=2 trial runs alone.
        tune.with_resources(_case_trial, trial_resources()), param_space=space,
        run_config=tune.RunConfig(storage_path=str(tmp_path_factory.mktemp("tune")),
                                  verbose=0))
    results = tuner.fit()
    assert not results.errors, results.errors
    # Every result of every trial: one per (N, B) the trial profiled, then the launch's
    # own (its whole seconds, no candidate), kept apart under the key "launch".
    rows = {}
    for result in results:
        records = result.metrics_dataframe.to_dict("records")
        rows[result.config["case"]] = [r for r in records
                                       if not math.isfinite(r.get(LAUNCH_TOTAL_KEY, math.nan))]
        rows[result.config["case"] + ":launch"] = [
            r for r in records if math.isfinite(r.get(LAUNCH_TOTAL_KEY, math.nan))]
    return rows


def test_one_worker_group_reports_each_batch_smallest_first(rows):
    """One trial, one launch, two results: (1, 32) then (1, 64), both measured."""
    sweep = rows["one"]
    assert [r["global_batch"] for r in sweep] == [32, 64]
    assert all(r["status"] == "ok" for r in sweep)
    assert sweep[0]["launch_wall_s"] == sweep[1]["launch_wall_s"] > 0  # one worker group
    # After the group ends, one result with the launch's whole seconds: more than its rows'.
    (launch,) = rows["one:launch"]
    assert launch[LAUNCH_TOTAL_KEY] > sweep[0]["launch_wall_s"] + sum(
        r["profile_wall_s"] for r in sweep)
    for r in sweep:  # the timed steps are part of the batch's wall time
        assert 0 < r["warmup_wall_s"] and 0 < r["timed_wall_s"]
        assert r["warmup_wall_s"] + r["timed_wall_s"] < r["profile_wall_s"]
        assert r["measure_steps"] >= BASE["measure_steps"]


def test_one_and_two_workers_report_every_field(rows):
    one, two = rows["one"][-1], rows["two"][-1]
    for row in (one, two):
        assert set(PROFILE_COLUMNS) <= set(row)
        assert row["status"] == "ok" and row["error"] == ""
        assert 0 < row["compute_time_s"] <= row["step_time_s"]  # no wall-clock bound
        assert row["samples_per_s"] == pytest.approx(64 / row["step_time_s"])
    # params + grads + the optimizer's state (SGD's momentum; Adam's two moments) at least
    assert one["peak_mem_bytes"] > 3 * 215_000 * 4
    assert two["peak_mem_bytes"] > 4 * (500 * 32 + 33 * 4) * 4
    assert (one["num_workers"], one["local_batch"], two["local_batch"]) == (1, 64, 32)
    assert one["sync_time_s"] == 0  # one worker: no DDP, no collective
    # The gloo all-reduce of 215k gradients costs about as much as timing noise
    # on loopback, so only consistency is asserted here, not sync > 0.
    assert two["sync_time_s"] >= 0
    assert two["sync_time_s"] == pytest.approx(two["step_time_s"] - two["compute_time_s"], abs=1e-12)
    assert one["cpus_per_worker"] == two["cpus_per_worker"] == 1.0  # one core per worker
    assert len(profile_frame([one, two])) == 2  # the table the models fit from accepts them


def test_every_row_measures_the_gradient_noise(rows):
    """Issue 25, item 1: one worker from the halves of its batch, two from their own
    gradients and the all-reduced one; a user's plain Dataset of tokens too."""
    for row in (*rows["one"], *rows["two"]):
        assert row["noise_steps"] >= 3, row
        # Random images and labels (and barely trained tokens): the noise is sure, the
        # signal |G|^2 small (a few pairs may estimate it below 0; the plan reads that
        # as all noise).
        assert row["grad_var"] > 0 and math.isfinite(row["grad_sqr"]), row
        assert abs(row["grad_sqr"]) < row["grad_var"], row


def test_each_worker_group_measures_the_epochs_other_costs_once(rows):
    """Issue 24: a worker group's first row carries one evaluation pass (split over its
    N workers), rank 0's checkpoint write and the data load; its last row the evaluation
    pass again (its cost moves with b: the plan interpolates between the two), not the
    checkpoint; the steps are the data path `train` takes: gathered from in-memory
    tensors, or a user's plain Dataset through a DataLoader."""
    first, second = rows["one"]
    assert first["eval_time_s"] > 0 and first["checkpoint_time_s"] > 0
    assert second["eval_time_s"] > 0 and math.isnan(second["checkpoint_time_s"])
    assert first["eval_samples"] == second["eval_samples"] > 0
    assert first["data_load_s"] == second["data_load_s"] >= 0
    fitted = rows["oom"][0]  # B = 16; B = 32 ran out of memory in its first step
    assert {r["data_path"] for r in [*rows["one"], fitted]} == {"gather-host"}
    plain = rows["two"]
    assert all(r["status"] == "ok" for r in plain), plain[0]["error"]
    assert {r["data_path"] for r in plain} == {"loader"} and plain[0]["eval_time_s"] > 0
    assert all(0 < r["compute_time_s"] <= r["step_time_s"] for r in plain)


def test_memory_over_device_limit_is_oom_and_ends_the_sweep(rows):
    """Asked for 64, 32, 16: run smallest first; 16 fits, 32 is out of memory, and 64 is
    never run (a larger local batch would run out too)."""
    sweep = rows["oom"]
    assert [(r["global_batch"], r["status"]) for r in sweep] == [(16, "ok"), (32, "oom")]
    row = sweep[1]
    assert "device_memory_bytes" in row["error"] and row["peak_mem_bytes"] > _LIMIT
    assert math.isnan(row["step_time_s"])  # present (Tune's metric check) but not measured


def test_the_training_strategys_cost_is_measured_once_per_worker_group(rows):
    for case in ("one", "two"):  # ags at N = 1, ags-ns at N = 2
        sweep = rows[case]
        assert [(r["global_batch"], r["status"]) for r in sweep] == [(32, "ok"), (64, "ok")], \
            sweep[0]["error"]
        assert math.isfinite(sweep[0]["strategy_extra_s"])  # on the first row only
        assert math.isnan(sweep[1]["strategy_extra_s"])
    assert all(math.isnan(r["strategy_extra_s"]) for r in rows["oom"])  # none asked


@pytest.mark.parametrize("case, message", [
    ("indivisible", "not divisible"), ("unknown", "'no-such-model' is unknown"),
    ("too-big", "larger than the dataset")])
def test_infeasible_candidate_is_an_error_row(rows, case, message):
    (row,) = rows[case]
    assert row["status"] == "error" and message in row["error"]
    assert math.isnan(row["step_time_s"])


def test_rows_and_resources_without_ray():
    row = profile_row(2, 64, error="x" * 5000)
    assert set(PROFILE_COLUMNS) <= set(row) and row["local_batch"] == 32
    assert len(row["error"]) == 2000  # a traceback's tail, not all of it
    assert worker_shape({"CPU": 0.5}) == {"CPU": 0.5}
    assert worker_shape(use_gpu=True) == {"CPU": 1.0, "GPU": 1.0}
    assert worker_shape(use_gpu=False) == {"CPU": 1.0}
