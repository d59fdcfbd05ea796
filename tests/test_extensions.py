"""Adding a search strategy, a pricing, a compute form, a workload or a training strategy is a
change to one file: each file of tests/extensions/ registers one, and is then used through
the API and through the command line (`tula-ray --import FILE`), without Ray. What only Ray
workers run (a search and a training of a registered workload and training strategy) is in
test_extensions_ray.py."""

import json
import sys

import numpy as np
import pandas as pd
import pytest

import tula_ray
from extension_registries import FILES
from tula_ray.cli import main
from tula_ray.cli.extensions import import_extension
from tula_ray.models import perf
from tula_ray.planning.search_strategies import make_search_strategy
from tula_ray.planning.synthetic import example_params, synthetic_profiles
from tula_ray.space import SearchSpace

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")

SPACE = SearchSpace.build((1, 2, 4), min_batch=32, max_batch=512)


def _replay(tmp_path, *options, imports=(), profiles=None):
    """`tula-ray replay` (offline: no Ray) with `--import` of `imports`; its plan.json."""
    source = ["--synthetic"] if profiles is None else [str(profiles)]
    argv = [arg for name in imports for arg in ("--import", str(FILES[name]))]
    out = tmp_path / "plan"
    try:
        code = main([*argv, "replay", *source, *options, "--out", str(out)])
    except SystemExit as exit:  # argparse refuses a choice this way
        code = exit.code
    return code, (json.loads((out / "plan.json").read_text()) if code == 0 else None)


def test_a_search_strategy_from_one_file(registries, tmp_path, capsys):
    # The command line's choices are the registry's when it runs: unknown before the import.
    assert _replay(tmp_path, "--search-strategy", "diagonal")[0] == 2
    assert "invalid choice: 'diagonal'" in capsys.readouterr().err
    code, plan = _replay(tmp_path, "--search-strategy", "diagonal", imports=["diagonal_search"])
    assert code == 0 and plan["strategy"] == "diagonal"
    # The API: the same registration, through build_plan and the strategy's own proposal.
    proposal = make_search_strategy("diagonal").propose(SPACE.candidates(), pd.DataFrame(
        columns=["num_workers", "global_batch", "status", "local_batch"]))
    assert [(c.num_workers, c.global_batch) for c in proposal.candidates] == [
        (1, 32), (2, 64), (4, 128)]
    profiles = synthetic_profiles(SPACE.candidates(), example_params(), seed=1)
    assert tula_ray.build_plan(SPACE, profiles, epochs=2, dataset_size=4096,
                               search_strategy="diagonal").search_strategy == "diagonal"


def test_a_pricing_from_one_file(registries, tmp_path, capsys):
    assert _replay(tmp_path, "--pricing", "flat-fee:3")[0] == 2
    assert "pricing 'flat-fee:3' is not understood" in capsys.readouterr().err
    code, plan = _replay(tmp_path, "--pricing", "flat-fee:3", "--objective", "cost",
                         imports=["flat_fee_pricing"])
    assert code == 0 and plan["pricing"] == {"kind": "flat-fee", "usd_per_node": 3.0,
                                             "usd_per_node_hour": 2.0}
    fee = import_extension(str(FILES["flat_fee_pricing"])).FlatFeePricing(usd_per_node=3.0)
    profiles = synthetic_profiles(SPACE.candidates(), example_params(), seed=1)
    built = tula_ray.build_plan(SPACE, profiles, epochs=2, dataset_size=4096, pricing=fee)
    table = built.table
    expected = table["num_workers"] * (3.0 + 2.0 * table["total_time_s"] / 3600)
    assert np.allclose(table["cost_usd"], expected)
    again = tula_ray.Plan.from_json(built.to_json(tmp_path / "fee.json"))
    assert again.pricing == built.pricing  # the registered kind survives a plan's JSON


def _sqrt_profiles(curve_type) -> pd.DataFrame:
    curves = {n: curve_type(0.004, 2e-3 * n) for n in SPACE.cluster_sizes}
    truth = perf.PerfParams(compute=curves, compute_pooled=curves[1], sync_per_unit_s=0.008,
                            collective="ring")
    return synthetic_profiles(SPACE.candidates(), truth, noise=0.0)


def test_a_compute_form_from_one_file(registries, tmp_path):
    module = import_extension(str(FILES["sqrt_compute_form"]))
    csv = tmp_path / "profiles.csv"
    _sqrt_profiles(module.SqrtCurve).to_csv(csv, index=False)
    # The API: the form is tried first, fits the data's shape, and survives the plan's JSON.
    built = tula_ray.build_plan(SPACE, pd.read_csv(csv), epochs=2, dataset_size=4096,
                                search_strategy="full")
    assert {curve.form for curve in built.perf.compute.values()} == {"sqrt"}
    assert tula_ray.Plan.from_json(built.to_json(tmp_path / "p.json")).perf == built.perf
    # The command line, in a fresh registry: imported by --import, used by replay.
    from tula_ray.models import compute_forms

    compute_forms.unregister_compute_form("sqrt")
    sys.modules.pop("sqrt_compute_form")
    code, plan = _replay(tmp_path, "--search-strategy", "full", profiles=csv,
                         imports=["sqrt_compute_form"])
    assert code == 0
    assert {c["form"] for c in plan["perf"]["compute"].values()} == {"sqrt"}


def test_a_workload_and_a_training_strategy_from_one_file_each(registries):
    import_extension(str(FILES["tiny_workload"]))
    import_extension(str(FILES["adam_strategy"]))
    from tula_ray.training.run import fit

    # The API, in this process: both by name, as a driver script would use them.
    frame = fit("tiny-mlp", global_batch=32, strategy="adam-ext", epochs=2)
    assert list(frame["strategy"]) == ["adam-ext", "adam-ext"]
    assert np.isfinite(frame["train_loss"]).all()
    assert frame["test_accuracy"].iloc[-1] > 0.2  # learns: chance is 0.1
    with pytest.raises(ValueError, match="option 'momentum' is unknown for strategy 'adam-ext'"):
        fit("tiny-mlp", global_batch=32, strategy="adam-ext", epochs=1,
            options={"momentum": 0.9})
    with pytest.raises(ValueError, match="'tiny-mlp' is built in|register yours"):
        tula_ray.register_workload("fashion-mnist-cnn", lambda: None)
