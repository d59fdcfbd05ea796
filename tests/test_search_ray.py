"""tula_ray.search() on local Ray: partial and full search, OOM handling, bad input.

The CNN on real Fashion-MNIST (a 2048-image subset: the data budget is tiny,
the model and the loop are the real ones), N in {1, 2}, B in {32, 64, 128}.
"""

import dataclasses

import numpy as np
import pytest

import tula_ray
from tula_ray import measure
from tula_ray.workloads import get_workload

pytestmark = pytest.mark.ray

WORKLOAD = dict(workload="fashion-mnist-cnn", workload_options={"train_subset": 2048})
QUICK = dict(warmup_steps=2, measure_steps=5, min_batch=32, max_batch=128)
# The partial model extrapolates from 4 noisy corners to B = 64 from 3-step
# medians on a shared 2-core machine: NOTES-ENV measured ~15 % (up to ~50 %)
# between processes for the very same candidate. The bound is set above that.
PARTIAL_VS_FULL_MEDIAN_TOLERANCE = 0.5


@pytest.fixture(scope="module")
def full_plan(ray_session, tmp_path_factory):
    return tula_ray.search(**WORKLOAD, **QUICK, cluster_sizes=(1, 2), mode="full",
                           objective="time", storage_path=str(tmp_path_factory.mktemp("full")))


@pytest.fixture(scope="module")
def partial_plan(ray_session, tmp_path_factory):
    return tula_ray.search(**WORKLOAD, **QUICK, cluster_sizes=(1, 2), mode="partial",
                           objective="knee", storage_path=str(tmp_path_factory.mktemp("partial")))


def test_partial_search_profiles_the_corners_and_predicts_every_candidate(partial_plan):
    table = partial_plan.table
    assert len(table) == 6
    assert table["step_time_s"].gt(0).all() and table["total_time_s"].gt(0).all()
    measured = table[table["source"] == "measured"]
    assert sorted(zip(measured["num_workers"], measured["global_batch"])) == [
        (1, 32), (1, 128), (2, 32), (2, 128)]
    assert measured["measured_step_time_s"].gt(0).all()
    assert (measured["status"] == "ok").all()
    # N = 2 really ran DDP: the synced step took longer than compute alone.
    two = measured[measured["num_workers"] == 2]
    assert two["measured_sync_time_s"].gt(0).all()
    assert measured.loc[measured["num_workers"] == 1, "measured_sync_time_s"].eq(0).all()
    assert partial_plan.choice.objective == "knee"
    assert partial_plan.meta["trials"] == 4


def test_full_search_measures_every_candidate(full_plan):
    table = full_plan.table
    assert len(table) == 6 and (table["source"] == "measured").all()
    assert table["measured_step_time_s"].gt(0).all()
    best = table.loc[table["total_time_s"].idxmin()]
    assert (full_plan.choice.num_workers, full_plan.choice.global_batch) == (
        best["num_workers"], best["global_batch"])


def test_partial_predictions_agree_with_full_measurements(partial_plan, full_plan):
    merged = partial_plan.table.merge(full_plan.table, on=["num_workers", "global_batch"],
                                      suffixes=("_partial", "_full"))
    error = (np.abs(merged["step_time_s_partial"] - merged["measured_step_time_s_full"])
             / merged["measured_step_time_s_full"])
    assert float(np.median(error)) <= PARTIAL_VS_FULL_MEDIAN_TOLERANCE, merged


def test_plan_round_trips_and_plots(partial_plan, tmp_path):
    again = tula_ray.Plan.from_json(partial_plan.to_json(tmp_path / "plan.json"))
    assert again.choice == partial_plan.choice
    assert all(p.stat().st_size > 0 for p in again.plot(tmp_path))


def test_out_of_memory_candidate_is_infeasible_and_the_search_goes_on(
        ray_session, tmp_path, monkeypatch):
    """The memory model underestimates (paper §IV-B: "memory estimation can be
    conservative"): B = 128 enters the space, runs out of memory when profiled,
    and partial search falls back to the next batch inward."""
    from tula_ray import api

    workload = get_workload("fashion-mnist-cnn", train_subset=2048)
    low, high = (measure.peak_memory_bytes(workload, b, device="cpu") for b in (64, 128))
    real_probe = api.probe_memory

    def optimistic_probe(*args, **kwargs):
        probe = real_probe(*args, **kwargs)
        params = probe["params"]
        probe["params"] = dataclasses.replace(
            params, activation_bytes_per_sample=params.activation_bytes_per_sample / 4)
        return probe

    monkeypatch.setattr(api, "probe_memory", optimistic_probe)
    plan = tula_ray.search(**WORKLOAD, **QUICK, cluster_sizes=(1,), mode="partial",
                           objective="time", device_memory_gb=(low + high) / 2 / 1e9,
                           headroom=0.0, storage_path=str(tmp_path))
    table = plan.table.set_index("global_batch")
    assert table.loc[128, "status"] == "oom"
    assert table.loc[128, "infeasible_reason"] == "out of memory when profiled"
    assert table.loc[64, "feasible"] and table.loc[64, "source"] == "measured"
    assert plan.choice.global_batch <= 64


@pytest.mark.parametrize("kwargs, message", [
    (dict(workload="imagenet-vit"), "workload 'imagenet-vit' is unknown"),
    (dict(cluster_sizes=(1, 4)), "cluster size 4 is larger than the cluster's 2 CPUs"),
    (dict(objective="fastest"), "objective 'fastest' is unknown"),
    (dict(mode="half"), "mode 'half' is unknown"),
    (dict(min_batch=0), "min_batch=0; it must be an integer >= 1"),
    (dict(min_batch=64, max_batch=32), "max_batch=32 is below min_batch=64"),
    (dict(device_memory_gb=1e-6), "min_batch=32 does not fit"),
])
def test_bad_input_fails_before_any_trial(ray_session, tmp_path, kwargs, message):
    options = {**WORKLOAD, "cluster_sizes": (1, 2), "storage_path": str(tmp_path), **kwargs}
    with pytest.raises(ValueError, match=message):
        tula_ray.search(**options)
    assert not list(tmp_path.iterdir())  # no Tune experiment was started
