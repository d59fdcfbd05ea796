"""The extensions that Ray workers run, each from its one file of tests/extensions/: a
registered workload and a registered training strategy, by name, through the command line
(`tula-ray --import ... search`: its workers profile the workload and time the strategy's
steps; the API's import is the same `import_extensions`, tests/test_extensions.py).
Neither file is importable by the workers: what the names stand for reaches them by value
(`tula-ray --import` marks the modules so)."""

import sys

import pytest
import yaml

import tula_ray
from extension_registries import FILES
from tula_ray.cli import main
from tula_ray.workloads import WORKLOADS

pytestmark = pytest.mark.ray

QUICK = dict(cluster_sizes=[1], min_batch=32, max_batch=64, warmup_steps=1, measure_steps=2,
             measure_seconds=0.2, epochs=1)


def test_registered_extensions_on_ray_workers_from_the_command_line(ray_session, registries,
                                                                    tmp_path, capsys):
    """`tula-ray --import ... search config.yaml` (in this process, on the run's Ray): the
    workload and training strategy the files register are built by the profiling workers
    (the strategy's steps timed), the search strategy and the pricing plan; no name is
    known before --import imports its file."""
    names = ("tiny_workload", "adam_strategy", "diagonal_search", "flat_fee_pricing")
    for name in names:  # forgotten first: the names come from --import alone
        sys.modules.pop(name, None)
    WORKLOADS.pop("tiny-mlp", None)
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump({
        "workload": "tiny-mlp", **QUICK, "strategy": "diagonal", "pricing": "flat-fee:1",
        "training_strategy": "adam-ext", "storage_path": str(tmp_path / "runs")}))
    imports = [arg for name in names for arg in ("--import", str(FILES[name]))]
    code = main([*imports, "search", str(config), "--out", str(tmp_path / "plan")])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    plan = tula_ray.Plan.from_json(tmp_path / "plan" / "plan.json")
    assert plan.workload == "tiny-mlp" and plan.search_strategy == "diagonal"
    assert plan.meta["training_strategy"] == "adam-ext" and plan.pricing["kind"] == "flat-fee"
    measured = plan.profiles[plan.profiles["status"] == "ok"]
    assert len(measured) >= 1 and measured["strategy_extra_s"].notna().all()
    assert f"N={plan.choice.num_workers}, B={plan.choice.global_batch}" in printed.out
    assert "adam-ext" in tula_ray.training.strategies.TRAINING_STRATEGIES  # --import added it
