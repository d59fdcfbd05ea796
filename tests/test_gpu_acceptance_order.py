"""gpu-acceptance's Ray half, in the order that cuts the least needed part when its time runs
short (issue 46, item 3; the H200 run of 2026-11-30 measured what each part takes): every
workload's search and `train` first, then the second searches, then bf16. Without Ray: the
searches and trainings are stand-ins that advance a clock."""

import contextlib
from types import SimpleNamespace

import pandas as pd

import tula_ray.cluster
from benchmarks.gpu import acceptance_ray

SEARCH_S, TRAIN_S = 60.0, 45.0


def _plan():
    profiles = pd.DataFrame({"status": ["ok"], "global_batch": [512], "step_time_s": [0.002],
                             "compute_time_s": [0.002], "step_time_spread": [0.1]})
    return SimpleNamespace(profiles=profiles, choice=SimpleNamespace(to_dict=lambda: {}))


def _run(monkeypatch, budget_s: float) -> tuple[list[tuple], dict]:
    clock, done = [0.0], []

    def search(name, samples, low, high, precision, storage, quick):
        done.append(("search", name, precision))
        clock[0] += SEARCH_S
        return _plan()

    def trained(plan, name, samples, storage):
        done.append(("train", name))
        clock[0] += TRAIN_S
        return {"trained": name, "num_workers": 1, "global_batch": 512,
                "predicted_epoch_s": 1.0, "epoch_seconds": [1.2, 1.0], "ratio": 1.0}

    monkeypatch.setattr(tula_ray.cluster, "ray_session", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(acceptance_ray, "_search", search)
    monkeypatch.setattr(acceptance_ray, "trained", trained)
    monkeypatch.setattr(acceptance_ray, "_has_torchvision", lambda: True)
    monkeypatch.setattr(acceptance_ray, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    result = acceptance_ray.ray_half(False, SimpleNamespace(type="cuda"),
                                     lambda: budget_s - clock[0])
    return done, result


def test_with_time_for_everything_each_part_runs_in_its_order(monkeypatch):
    done, result = _run(monkeypatch, budget_s=1000)
    assert done == [("search", "cnn", "fp32"), ("train", "cnn"),
                    ("search", "resnet18", "fp32"), ("train", "resnet18"),
                    ("search", "cnn", "fp32"), ("search", "resnet18", "fp32"),
                    ("search", "cnn", "bf16"), ("search", "resnet18", "bf16")]
    for entry in result["workloads"]:
        assert "plans" not in entry and "second_run" not in entry
        assert len(entry["twice"]) == 1 and entry["bf16_over_fp32"] == {512: 1.0}


def test_short_of_time_the_trainings_come_before_the_second_searches_and_bf16(monkeypatch):
    """250 s: both searches and trainings (210 s), then 40 s left, under a search's 60."""
    done, result = _run(monkeypatch, budget_s=250)
    assert done == [("search", "cnn", "fp32"), ("train", "cnn"),
                    ("search", "resnet18", "fp32"), ("train", "resnet18")]
    for entry in result["workloads"]:
        assert entry["train"]["trained"] == entry["workload"]
        assert entry["twice"] == [] and entry["second_run"] == "out of time"
        assert entry["bf16_over_fp32"] == "out of time"
    assert "its second fp32 run: out of time" in acceptance_ray.report(result)
