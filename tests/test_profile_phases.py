"""The measuring steps without Ray (issue 42, step 3): each phase of a profiled batch
(`tula_ray.training.profile_phases`) and a whole batch's row
(`tula_ray.training.profile_sweep`) on two gloo processes of a plain torch.distributed
group, a tiny model, a few steps; and the settings every trial shares
(`ProfileSettings`), read from the search's one dict and from a config saved before it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.common import spawn_gloo
from tula_ray.profile_table import PROFILE_COLUMNS
from tula_ray.training.profile_settings import (FIRST_NESTED_KEYS, FLAT_KEYS,
                                                PROFILE_SETTINGS_KEY, ProfileSettings)
from tula_ray.workloads import Workload

GROUP_TIMEOUT_S = 30
BATCH = 32  # global: 16 per rank
SAMPLES = 256


def _workload() -> Workload:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(SAMPLES, 6, generator=generator),
                         torch.randint(0, 3, (SAMPLES,), generator=generator))
    return Workload("tiny-phases", model_fn=lambda: nn.Sequential(
        nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3)),
        train_dataset_fn=lambda: data, test_dataset_fn=lambda: data)


SETTINGS = dict(warmup_steps=2, measure_steps=2, measure_seconds=0.05,
                training_strategy="lbt")


def _phases(sweep) -> dict:
    """Every phase function once, on the sweep's model and data, as `Sweep.profile` runs
    them; what each returned."""
    from tula_ray.training import profile_phases as phases

    training = sweep.training
    batches = sweep.batches(BATCH // sweep.world_size)
    tally = training.tally(BATCH // sweep.world_size)

    def run_step() -> None:
        tally.step(*next(batches))

    first = phases.first_step(training, run_step)
    peak, memory_s = phases.memory_step(training, batches)
    settled, settled_s = phases.warm_up(training, run_step, min_steps=2, min_seconds=0.0)
    compute = phases.compute_only_block(training, run_step, 2)
    synced = phases.synced_block(training, run_step, 2)
    alternated = len(training.agreement.phases)
    both = phases.compute_and_synced_steps(training, run_step, 4)
    order = training.agreement.phases[alternated:]
    before_noise = _weights(training.model)  # the no_sync steps took the replicas apart
    noise = phases.gradient_noise(training, batches, settled_s, sweep.world_size)
    after_noise = _weights(training.model)
    run = phases.StrategyRun("lbt", {}, BATCH, epochs=1, steps_per_epoch=4,
                             workload=sweep.workload)
    extra = phases.strategy_extra_s(training, run, batches, min_steps=2, budget_s=0.0)
    return {"first": first, "peak": peak, "memory_s": memory_s, "settled": settled,
            "settled_s": settled_s, "compute": compute, "synced": synced,
            "both": both, "order": order, "noise": [noise.steps, *noise.estimate()],
            "extra": extra, "distributed": training.distributed,
            "weights_before_noise": before_noise, "weights_after_noise": after_noise}


def _weights(model: nn.Module) -> list[float]:
    return torch.nn.utils.parameters_to_vector(model.parameters()).tolist()


def _rank(rank: int, directory: str) -> None:
    from tula_ray.training.profile_sweep import Sweep, SweepWorker, profile_batch

    settings = ProfileSettings(workload=_workload(), **SETTINGS)
    sweep = Sweep(settings, SweepWorker.of_process_group(), first_batch=BATCH)
    row = profile_batch(sweep, BATCH, round_index=1)
    # The timed steps carried `train`'s online noise work: its pairs, read on both ranks.
    sweep.training.noise.read()
    online = {"mode": sweep.training.noise.mode, "pairs": sweep.training.noise.average.steps}
    measured = _phases(sweep)
    with open(f"{directory}/{rank}.json", "w") as handle:
        json.dump({"row": row, "phases": measured, "online": online,
                   "ray_imported": any(name == "ray" or name.startswith("ray.")
                                       for name in sys.modules)}, handle)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, dict]:
    directory = tmp_path_factory.mktemp("profile-phases")
    spawn_gloo(_rank, 2, str(directory), timeout_s=GROUP_TIMEOUT_S)
    return {rank: json.loads(Path(directory, f"{rank}.json").read_text()) for rank in (0, 1)}


def test_the_phases_run_under_a_plain_process_group_without_ray(ranks):
    for rank, result in ranks.items():
        assert not result["ray_imported"], rank
        assert result["phases"]["distributed"]  # DDP over two ranks


def test_the_timed_steps_carry_the_online_noise_scales_work(ranks):
    """Issue 43, item 3: `train` measures the noise scale at every step (a comm hook, an
    optimizer pre-hook); the profiled steps do the same work, so the plan times it."""
    first, second = ranks[0]["online"], ranks[1]["online"]
    assert first == second  # the same pairs, read at the same point
    assert first["mode"] == "workers" and first["pairs"] >= 4


def test_each_phase_returns_its_measurements(ranks):
    from tula_ray.training.step_timing import ALTERNATING_BLOCKS

    for rank, result in ranks.items():
        measured = result["phases"]
        assert len(measured["first"]) == 1 and measured["first"][0] >= 0, rank
        assert measured["peak"] > 0 and measured["memory_s"] >= 0
        # at least min_steps no_sync steps, then DDP's two first synced steps
        assert len(measured["settled"]) >= 2 + 2 and measured["settled_s"] > 0
        assert len(measured["compute"]) == len(measured["synced"]) == 2
        assert all(s >= 0 for s in measured["compute"] + measured["synced"])
        compute, synced = measured["both"]
        per_block = math.ceil(4 / ALTERNATING_BLOCKS)
        assert len(compute) == len(synced) == ALTERNATING_BLOCKS * per_block
        assert all(s >= 0 for s in compute + synced)
        assert measured["order"] == ["compute steps", "synced steps"] * ALTERNATING_BLOCKS
        steps, grad_sqr, grad_var = measured["noise"]
        assert steps >= 3 and math.isfinite(grad_sqr) and math.isfinite(grad_var)
        assert math.isfinite(measured["extra"])
    # what is reduced over the ranks is the same on both
    for key in ("peak", "settled_s", "noise", "extra"):
        assert ranks[0]["phases"][key] == pytest.approx(ranks[1]["phases"][key]), key


def test_every_worker_measures_the_noise_at_the_same_weights(ranks):
    """The pairs set each worker's gradient against their mean: replicas apart (each
    stepped on its own gradient under no_sync) would add their difference to the noise.
    Rank 0's weights are broadcast first."""
    first, second = ranks[0]["phases"], ranks[1]["phases"]
    assert first["weights_before_noise"] != second["weights_before_noise"]
    assert first["weights_after_noise"] == second["weights_after_noise"]
    assert first["weights_after_noise"] == first["weights_before_noise"]  # rank 0's kept


def test_a_batch_row_has_every_column_and_adds_up(ranks):
    for rank, result in ranks.items():
        row = result["row"]
        assert set(PROFILE_COLUMNS) <= set(row), set(PROFILE_COLUMNS) - set(row)
        assert row["status"] == "ok", row["error"]
        assert (row["num_workers"], row["global_batch"], row["round"]) == (2, BATCH, 1)
        assert 0 < row["compute_time_s"] <= row["step_time_s"]
        assert row["sync_time_s"] == pytest.approx(row["step_time_s"] - row["compute_time_s"])
        assert row["sync_time_s"] >= 0 and row["measure_steps"] >= SETTINGS["measure_steps"]
        assert row["memory_source"] == "memtracker" and row["peak_mem_bytes"] > 0
        for key in ("strategy_extra_s", "checkpoint_time_s", "eval_time_s", "grad_sqr"):
            assert math.isfinite(row[key]), key
        # the pass's samples, for a run to a target's pricing; no split of its own
        assert row["eval_samples"] == SAMPLES and math.isnan(row["validation_samples"])
    assert ranks[0]["row"]["step_time_s"] == ranks[1]["row"]["step_time_s"]  # the slowest's
    # How far the model had trained when its noise was measured (issue 43, item 4): the
    # warm-up's and both timed phases' optimizer steps at B, on every rank alike.
    row = ranks[0]["row"]
    minimum = SETTINGS["warmup_steps"] + 2 * SETTINGS["measure_steps"]
    assert row["noise_after_steps"] >= minimum
    assert row["noise_after_samples"] == row["noise_after_steps"] * BATCH
    assert row["noise_after_steps"] == ranks[1]["row"]["noise_after_steps"]


def test_the_strategy_is_measured_where_it_runs_as_configured():
    from tula_ray.training.profile_phases import strategy_batch

    assert strategy_batch("ags", {}, 1, 32, 60000) == (64, {})  # 32 needs a small batch < 32
    assert strategy_batch("ags", {}, 2, 32, 60000) == (128, {})  # b = 64 keeps sub-batch
    # B = 32 trains plain steps (no larger than the reference 32); 64 switches to local.
    assert strategy_batch("ags", {}, 2, 32, 100) == (64, {"source": "local"})
    assert strategy_batch("ags", {}, 2, 16, 32) == (16, {})  # only plain steps fit
    assert strategy_batch("polo", {}, 1, 32, 100) == (32, {})  # N=1: plain
    assert strategy_batch("ags-ns", {}, 2, 32, 60000) == (
        64, {"source": "local"})  # its reference batch 32 needs B > 32; always local at N=2
    assert strategy_batch(None, {}, 2, 32, 100) == (None, {})
    local = {"source": "local"}
    assert strategy_batch("ags", local, 1, 32, 64) == (None, {})  # nothing it takes


# ---------------------------------------------------------------- the settings

SEARCH_SETTINGS = ProfileSettings(
    workload="fashion-mnist-cnn", workload_options={"data": "fake"}, epochs=2,
    training_strategy="ags-ns", training_options={"source": "local"}, warmup_steps=1,
    measure_steps=2, measure_seconds=0.2, device_memory_bytes=2e9, use_gpu=False,
    resources_per_worker={"CPU": 1.0}, workers_per_node=2, provision_timeout_s=60.0)


def test_the_settings_travel_as_one_plain_dict_and_come_back_typed():
    config = {"num_workers": 2, "global_batches": [32], "round": 1,
              **SEARCH_SETTINGS.to_config()}
    assert set(config) == {"num_workers", "global_batches", "round", PROFILE_SETTINGS_KEY}
    assert type(config[PROFILE_SETTINGS_KEY]) is dict
    assert ProfileSettings.from_config(config) == SEARCH_SETTINGS


def test_a_trial_config_saved_before_the_settings_were_one_dict_is_read_alike():
    # The keys of the search's trial config before issue 42, step 3 (its `constants`).
    saved = {"num_workers": 2, "global_batches": [32], "round": 1,
             "workload": "fashion-mnist-cnn", "workload_options": {"data": "fake"},
             "use_gpu": False, "warmup_steps": 1, "measure_steps": 2,
             "measure_seconds": 0.2, "device_memory_bytes": 2e9,
             "resources_per_worker": {"CPU": 1.0}, "workers_per_node": 2,
             "provision_timeout_s": 60.0, "epochs": 2, "training_strategy": "ags-ns",
             "training_options": {"source": "local"}}
    assert set(saved) - {"num_workers", "global_batches", "round"} == set(FLAT_KEYS)
    assert ProfileSettings.from_config(saved) == SEARCH_SETTINGS
    assert SEARCH_SETTINGS.to_config(flat=True) == {k: saved[k] for k in FLAT_KEYS}
    defaults = ProfileSettings.from_config({"workload": "x", "training_options": None})
    assert (defaults.warmup_steps, defaults.seed, defaults.training_options) == (3, 0, {})


def test_a_resumed_search_keeps_the_layout_it_was_saved_with():
    from tula_ray.runs.search_experiment import (SETTINGS_LAYOUT_KEY, SETTINGS_NAMES_KEY,
                                                 trial_param_space)

    new = trial_param_space(SEARCH_SETTINGS, None)
    assert set(new) == {PROFILE_SETTINGS_KEY}
    assert set(new[PROFILE_SETTINGS_KEY]) == set(SEARCH_SETTINGS.to_dict())
    saved_now = SimpleNamespace(resume_record={
        SETTINGS_LAYOUT_KEY: PROFILE_SETTINGS_KEY,
        SETTINGS_NAMES_KEY: list(SEARCH_SETTINGS.to_dict())})
    assert trial_param_space(SEARCH_SETTINGS, saved_now) == new
    # One dict, saved before its names were recorded (and before storage_path): Tune
    # restores it only with the keys it started with.
    saved_nested = SimpleNamespace(resume_record={SETTINGS_LAYOUT_KEY: PROFILE_SETTINGS_KEY})
    restored = trial_param_space(SEARCH_SETTINGS, saved_nested)[PROFILE_SETTINGS_KEY]
    assert set(restored) == set(FIRST_NESTED_KEYS) and "storage_path" not in restored
    assert ProfileSettings.from_config({PROFILE_SETTINGS_KEY: restored}).storage_path is None
    saved_before = SimpleNamespace(resume_record={"request": {}})  # no layout: each key at the top
    assert set(trial_param_space(SEARCH_SETTINGS, saved_before)) == set(FLAT_KEYS)


def test_a_new_search_restores_with_every_setting_it_started_with():
    from tula_ray.models.memory import MemoryParams
    from tula_ray.planning.bounds import MemoryProbe, SearchBounds
    from tula_ray.runs.search_experiment import resume_record, trial_param_space
    from tula_ray.space import SearchSpace

    settings = ProfileSettings(workload="fashion-mnist-cnn", storage_path="/tmp/storage")
    bounds = SearchBounds(SearchSpace((1, 2), (32, 64)),
                          MemoryProbe(MemoryParams(1e6, 0.0, 1e3, 1e2), [], max_local_batch=64),
                          2e9)
    record = json.loads(json.dumps(resume_record(bounds, False, 1.0, {})))  # as saved
    restored = trial_param_space(settings, SimpleNamespace(resume_record=record))
    assert restored == trial_param_space(settings, None)
    assert restored[PROFILE_SETTINGS_KEY]["storage_path"] == "/tmp/storage"


@pytest.mark.parametrize("eval_batch", [None, 8])
def test_the_sweeps_largest_batch_times_the_evaluation_pass_again(eval_batch):
    """One process: the first batch's row times the epoch's costs; the last batch's times
    the evaluation pass again (its cost per sample moves with b), but not for a workload
    that evaluates at a batch of its own (the same pass twice)."""
    import dataclasses

    from tula_ray.training.profile_sweep import Sweep, SweepWorker, profile_batch

    workload = dataclasses.replace(_workload(), eval_batch=eval_batch)
    settings = ProfileSettings(workload=workload, **{**SETTINGS, "training_strategy": None})
    sweep = Sweep(settings, SweepWorker.of_process_group(), first_batch=16, last_batch=64)
    first, middle, last = (profile_batch(sweep, batch) for batch in (16, 32, 64))
    assert math.isfinite(first["eval_time_s"]) and math.isfinite(first["checkpoint_time_s"])
    assert math.isnan(middle["eval_time_s"]) and math.isnan(last["checkpoint_time_s"])
    if eval_batch is None:
        assert math.isfinite(last["eval_time_s"]) and last["eval_samples"] == SAMPLES
    else:
        assert math.isnan(last["eval_time_s"])
