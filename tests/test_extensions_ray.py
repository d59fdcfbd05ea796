"""The extensions that Ray workers run, each from its one file of tests/extensions/: a
registered workload and a registered training strategy, by name, through the API (a search
whose workers profile the workload and time the strategy's steps) and through the command
line (`tula-ray --import ... train`). Neither file is importable by the workers: what the
names stand for reaches them by value (`tula-ray --import` marks the modules so)."""

import sys

import pytest

import tula_ray
from extension_registries import FILES
from tula_ray.cli import main
from tula_ray.cli.extensions import import_extensions
from tula_ray.training.strategies import unregister_training_strategy
from tula_ray.workloads import WORKLOADS

pytestmark = pytest.mark.ray

QUICK = dict(cluster_sizes=(1,), min_batch=32, max_batch=64, warmup_steps=1, measure_steps=2,
             measure_seconds=0.2, epochs=1)


def test_a_registered_workload_and_training_strategy_on_ray_workers(ray_session, registries,
                                                                     tmp_path, capsys):
    import_extensions([str(FILES[name]) for name in ("tiny_workload", "adam_strategy",
                                                      "diagonal_search", "flat_fee_pricing")])
    # The API: every extension by name; the workers build the workload and time adam-ext.
    plan = tula_ray.search("tiny-mlp", **QUICK, strategy="diagonal", pricing="flat-fee:1",
                           training_strategy="adam-ext", storage_path=str(tmp_path / "runs"))
    assert plan.workload == "tiny-mlp" and plan.strategy == "diagonal"
    assert plan.meta["training_strategy"] == "adam-ext" and plan.pricing["kind"] == "flat-fee"
    measured = plan.profiles[plan.profiles["status"] == "ok"]
    assert len(measured) >= 1 and measured["strategy_extra_s"].notna().all()
    plan_file = tmp_path / "plan.json"
    plan.to_json(plan_file)

    # The command line, with both forgotten first: the names come from --import alone.
    unregister_training_strategy("adam-ext")
    WORKLOADS.pop("tiny-mlp")
    for name in ("tiny_workload", "adam_strategy"):
        sys.modules.pop(name)
    out = tmp_path / "train"
    code = main(["--import", str(FILES["tiny_workload"]), "--import", str(FILES["adam_strategy"]),
                 "train", str(plan_file), "--strategy", "adam-ext", "--epochs", "1",
                 "--storage-path", str(tmp_path / "runs"), "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"trained N=1, B={plan.choice.global_batch} with adam-ext" in printed.out
    assert (out / "train_metrics.csv").is_file()
    assert "adam-ext" in tula_ray.training.strategies.TRAINING_STRATEGIES  # --import added it
