"""The `tula-ray` command's offline paths and its errors (no Ray session)."""

from pathlib import Path

import pandas as pd
import numpy as np
import pytest
from result_checks import summary_words

from tula_ray.cli import main
from tula_ray.planning.plan import Plan
from tula_ray.runs.adaptive_batch import BATCH_MODES
from tula_ray.training.budget import BUDGETS
from tula_ray.training.strategies import TRAINING_STRATEGY_DEFAULT

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")


def test_replay_synthetic_writes_a_plan_and_figures(tmp_path, capsys):
    assert main(["replay", "--synthetic", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "choice (knee): N=" in printed and "leave-one-out error" in printed
    plan = Plan.from_json(tmp_path / "plan.json")
    assert len(plan.table) == 14 and (tmp_path / "time_vs_batch.png").stat().st_size > 0


def test_replay_of_a_saved_plan_refits_its_profiles(tmp_path, capsys):
    main(["replay", "--synthetic", "--out", str(tmp_path / "first")])
    assert main(["replay", str(tmp_path / "first" / "plan.json"), "--search-strategy", "full",
                 "--objective", "time", "--out", str(tmp_path / "again")]) == 0
    again = Plan.from_json(tmp_path / "again" / "plan.json")
    assert again.search_strategy == "full" and again.perf.num_profiles == 14
    assert again.choice.objective == "time"


def test_replay_of_a_saved_plan_for_another_target(tmp_path):
    """A re-plan for a target the user measured phi at (--noise-scale) and reached in other
    epochs at the reference batch (--epochs): neither is dropped for a plan.json."""
    main(["replay", "--synthetic", "--out", str(tmp_path / "first")])
    assert main(["replay", str(tmp_path / "first" / "plan.json"), "--epochs", "7",
                 "--noise-scale", "250", "--objective", "time_to_accuracy",
                 "--out", str(tmp_path / "again")]) == 0
    again = Plan.from_json(tmp_path / "again" / "plan.json")
    assert again.epochs == 7 and again.meta["noise"]["given"] == 250.0
    assert set(again.table["noise_scale"]) == {250.0}


def test_replay_of_a_csv(tmp_path):
    main(["replay", "--synthetic", "--out", str(tmp_path)])
    Plan.from_json(tmp_path / "plan.json").profiles.to_csv(tmp_path / "profiles.csv", index=False)
    assert main(["replay", str(tmp_path / "profiles.csv"), "--out", str(tmp_path / "csv")]) == 0
    assert len(pd.read_csv(tmp_path / "profiles.csv")) == 14


def test_search_config_with_an_unknown_key_is_refused(tmp_path, capsys):
    config = tmp_path / "search.yaml"
    config.write_text("workload: fashion-mnist-cnn\nclustersizes: [1, 2]\n")
    assert main(["search", str(config)]) == 2
    error = capsys.readouterr().err
    assert "unknown key 'clustersizes'" in error and "cluster_sizes" in error


def test_bad_pricing_is_a_clear_error(tmp_path, capsys):
    assert main(["replay", "--synthetic", "--pricing", "hourly", "--out", str(tmp_path)]) == 2
    assert "pricing 'hourly' is not understood" in capsys.readouterr().err


def test_trains_target_and_cloud_options_reach_train(monkeypatch, tmp_path):
    """Issues 43 and 45: the command line's --target-accuracy, --eval-every-samples,
    --validation-fraction, --keep-checkpoints and --collective-timeout-s are train()'s
    keywords (train itself is stopped: what it is given is checked)."""
    import tula_ray.runs.train as train_module

    given = {}

    def train(plan, **kwargs):
        given.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(train_module, "train", train)
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    with pytest.raises(SystemExit):
        main(["train", str(plan), "--target-accuracy", "0.9", "--eval-every-samples", "512",
              "--validation-fraction", "0.2", "--keep-checkpoints", "3",
              "--collective-timeout-s", "90"])
    assert (given["target_accuracy"], given["eval_every_samples"], given["validation_fraction"],
            given["keep_checkpoints"], given["collective_timeout_s"]) == (0.9, 512, 0.2, 3, 90.0)


def test_train_arguments_are_parsed():
    from tula_ray.cli import build_parser

    args = build_parser().parse_args(["train", "plan/plan.json", "--strategy", "lrs", "--epochs", "3",
                                 "--storage-path", "runs", "--out", "metrics"])
    assert (args.plan.name, args.strategy, args.epochs) == ("plan.json", "lrs", 3)
    assert (args.storage_path, str(args.out), args.max_failures) == (
        str(Path("runs").resolve()), "metrics", None)
    cloud = build_parser().parse_args(["demo", "--storage-path", "s3://bucket/tula", "--address", "auto"])
    assert (cloud.storage_path, cloud.address) == ("s3://bucket/tula", "auto")  # URI kept as is
    defaults = build_parser().parse_args(["demo", "--train"])
    assert defaults.train and defaults.epochs is None
    tune = build_parser().parse_args(["tune", "plan/plan.json"])
    # The CLI's defaults are the library's (it repeats the name to keep torch out of start-up).
    assert defaults.strategy == tune.strategy == TRAINING_STRATEGY_DEFAULT
    budget = build_parser().parse_args(["train", "plan.json", "--budget", "scale-invariant"])
    assert defaults.budget == "epochs" and budget.budget == "scale-invariant"
    parser_budgets = next(a.choices for a in build_parser()._subparsers._group_actions[0]
                          .choices["train"]._actions if a.dest == "budget")
    assert tuple(parser_budgets) == BUDGETS
    parser_batches = next(a.choices for a in build_parser()._subparsers._group_actions[0]
                          .choices["train"]._actions if a.dest == "batch")
    assert tuple(parser_batches) == BATCH_MODES
    adaptive = build_parser().parse_args(["train", "plan.json", "--batch", "adaptive"])
    assert adaptive.batch == "adaptive" and budget.batch is None  # None: the plan's choice


def test_train_of_a_missing_plan_is_a_clear_error(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nowhere.json")]) == 2
    assert "nowhere.json does not exist" in capsys.readouterr().err


def test_train_refuses_bad_input_before_starting_ray(tmp_path, capsys):
    """A replayed synthetic plan names no workload; an unknown strategy is named. No Ray starts."""
    main(["replay", "--synthetic", "--out", str(tmp_path)])
    capsys.readouterr()
    assert main(["train", str(tmp_path / "plan.json")]) == 2
    assert "the plan does not record a workload" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "plan.json"), "--strategy", "sgd"]) == 2
    assert "strategy 'sgd' is unknown" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()


def test_tune_refuses_bad_input_before_starting_ray_and_train_reads_its_config(tmp_path, capsys):
    """`tula-ray tune` checks like `train`; `train --config` takes only tune's keys."""
    main(["replay", "--synthetic", "--out", str(tmp_path)])
    capsys.readouterr()
    plan = str(tmp_path / "plan.json")
    assert main(["tune", str(tmp_path / "nowhere.json")]) == 2
    assert "nowhere.json does not exist" in capsys.readouterr().err
    assert main(["tune", plan, "--workload", "fashion-mnist-cnn", "--trials", "0"]) == 2
    assert "trials=0" in capsys.readouterr().err
    assert main(["tune", plan, "--strategy", "sgd"]) == 2
    assert "strategy 'sgd' is unknown" in capsys.readouterr().err
    config = tmp_path / "tuned.json"
    config.write_text('{"strategy": "lrs", "lr": 0.02, "momentum": 0.5}')
    assert main(["train", plan, "--config", str(config)]) == 2
    assert "expected the keys strategy, lr, strategy_options" in capsys.readouterr().err
    config.write_text('{"strategy": "lrs", "lr": 0.02, "strategy_options": {"delta": 1}}')
    assert main(["train", plan, "--workload", "fashion-mnist-cnn", "--config", str(config)]) == 2
    assert "option 'delta' is unknown for strategy 'lrs'" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()


def test_search_resume_needs_the_name_of_the_search_to_continue(tmp_path, capsys):
    config = tmp_path / "search.yaml"
    config.write_text("workload: fashion-mnist-cnn\ncluster_sizes: [1, 2]\n")
    assert main(["search", str(config), "--resume"]) == 2  # refused before Ray starts
    error = capsys.readouterr().err
    assert "resume=True needs name=" in error


@pytest.fixture
def search_arguments(monkeypatch) -> dict:
    """What `tula-ray search` passes to `tula_ray.search`, which stops there (ValueError)."""
    import functools
    import importlib

    module = importlib.import_module("tula_ray.runs.search")
    seen = {}

    @functools.wraps(module.search)  # the real signature: the config's keys are checked on it
    def fake_search(**kwargs):
        seen.update(kwargs)
        raise ValueError("stopped here")

    monkeypatch.setattr(module, "search", fake_search)
    return seen


def test_search_resume_flag_continues_the_named_search(tmp_path, search_arguments, capsys):
    seen = search_arguments
    config = tmp_path / "search.yaml"
    config.write_text("workload: fashion-mnist-cnn\nname: nightly\nstorage_path: /tmp/x\n")
    assert main(["search", str(config), "--resume"]) == 2
    assert seen["resume"] is True and seen["name"] == "nightly"
    seen.clear()
    assert main(["search", str(config)]) == 2
    assert "resume" not in seen and seen["name"] == "nightly"  # the file alone: no resume


def test_verbose_flag_is_searchs_verbose_2_and_warnings_print_in_100_columns(
        tmp_path, search_arguments, capsys):
    from tula_ray.cli.command import readable_warning

    seen = search_arguments
    config = tmp_path / "search.yaml"
    config.write_text("workload: fashion-mnist-cnn\n")
    assert main(["--verbose", "search", str(config)]) == 2
    assert seen["verbose"] == 2
    seen.clear()
    assert main(["search", str(config)]) == 2
    assert "verbose" not in seen  # search's own default (1): progress lines, no Ray boxes

    text = readable_warning(UserWarning("x " * 120), UserWarning, "/a/long/path.py", 7)
    lines = text.splitlines()
    assert lines[0].startswith("warning: UserWarning: x x") and len(lines) == 3
    assert max(map(len, lines)) <= 100 and "path.py" not in text


def test_runtime_env_json_is_parsed_for_every_command_that_starts_ray(capsys):
    import pytest

    from tula_ray.cli import build_parser

    runtime_env = '{"py_modules": ["my_models"], "env_vars": {"NCCL_DEBUG": "INFO"}}'
    for command in (["demo"], ["search", "s.yaml"], ["train", "p.json"], ["tune", "p.json"]):
        args = build_parser().parse_args([*command, "--runtime-env-json", runtime_env])
        assert args.runtime_env == {"py_modules": ["my_models"],
                                    "env_vars": {"NCCL_DEBUG": "INFO"}}
    for bad in ("{not json", '["my_models"]'):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["demo", "--runtime-env-json", bad])
        assert "--runtime-env-json" in capsys.readouterr().err


def test_demo_without_any_means_to_get_its_data_stops_at_once_saying_what_to_do(
        tmp_path, monkeypatch, capsys):
    """Issue 22, item 1: no Fashion-MNIST on the machine and no source answering: the
    command exits with 2 before starting Ray (within 10 s), naming what to do."""
    import time

    from tula_ray.workloads import fashion_mnist_files as files

    monkeypatch.setattr(files, "DEBIAN_DATA_DIR", tmp_path / "no-debian-package")
    monkeypatch.setenv(files.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(files.DATA_DIR_ENV, raising=False)

    def unreachable(directory, deadline):
        raise OSError("network is unreachable")

    monkeypatch.setattr(files, "fetch_debian_package", unreachable)
    monkeypatch.setattr(files, "fetch_torchvision", unreachable)
    started = time.monotonic()
    assert main(["demo", "--out", str(tmp_path / "plan")]) == 2
    assert time.monotonic() - started < 10
    error = capsys.readouterr().err
    assert "Fashion-MNIST is not on this machine and could not be downloaded" in error
    assert "apt-get install dataset-fashion-mnist" in error and "TULA_DATA_DIR" in error
    assert not (tmp_path / "plan").exists()


def test_replay_keeps_what_the_training_strategy_cannot_train(tmp_path):
    """A replayed plan.json keeps its candidates the training strategy refused out of the
    choice (issue 22, item 6): the replay cannot re-ask a strategy it may not know."""
    from tula_ray import build_plan
    from tula_ray.space import SearchSpace
    from tula_ray.planning.synthetic import example_params, synthetic_profiles

    space = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
    profiles = synthetic_profiles(space.candidates(), example_params())
    free = build_plan(space, profiles, epochs=2, dataset_size=4096, objective="time")
    chosen = (free.choice.num_workers, free.choice.global_batch)
    plan = build_plan(space, profiles, epochs=2, dataset_size=4096, objective="time",
                      untrainable={chosen: "refused by the test"},
                      meta={"training_strategy": "ags"})
    assert (plan.choice.num_workers, plan.choice.global_batch) != chosen
    assert "cannot train" in summary_words(plan)
    plan.to_json(tmp_path / "plan.json")
    assert main(["replay", str(tmp_path / "plan.json"), "--objective", "time",
                 "--out", str(tmp_path / "again")]) == 0
    again = Plan.from_json(tmp_path / "again" / "plan.json")
    row = again.table.set_index(["num_workers", "global_batch"]).loc[chosen]
    assert not row["trainable"] and not row["feasible"]
    assert row["infeasible_reason"] == "the training strategy cannot train it: refused by the test"
    assert (again.choice.num_workers, again.choice.global_batch) == (
        plan.choice.num_workers, plan.choice.global_batch)


def test_replay_keeps_where_the_training_strategy_trains_plain_steps(tmp_path):
    """A replayed plan.json adds the strategy's cost per step where the plan did, and not
    where it trains plain SGD steps (`plain_steps`), with no strategy to re-ask."""
    from tula_ray import build_plan
    from tula_ray.space import SearchSpace
    from tula_ray.planning.synthetic import example_params, synthetic_profiles

    space = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
    profiles = synthetic_profiles(space.candidates(), example_params()).assign(
        strategy_extra_s=0.003)
    plan = build_plan(space, profiles, epochs=2, dataset_size=4096, objective="time",
                      plain_steps={(1, 32), (2, 32)}, meta={"training_strategy": "ags-ns"})
    plan.to_json(tmp_path / "plan.json")
    assert main(["replay", str(tmp_path / "plan.json"), "--objective", "time",
                 "--out", str(tmp_path / "again")]) == 0
    again = Plan.from_json(tmp_path / "again" / "plan.json").table
    assert again["plain_steps"].tolist() == plan.table["plain_steps"].tolist()
    assert again["strategy_extra_s"].to_numpy() == pytest.approx(
        plan.table["strategy_extra_s"].to_numpy())
    assert (again.loc[again["global_batch"] == 32, "strategy_extra_s"] == 0).all()


def test_replay_keeps_how_the_workload_evaluates(tmp_path):
    """A plan whose workload evaluates at the local batch prices its evaluation pass at each
    b; its replay does the same (the context's `eval_at_local_batch`), not the pass as
    measured at every b."""
    from tula_ray import build_plan
    from tula_ray.space import SearchSpace
    from tula_ray.planning.synthetic import example_params, synthetic_profiles

    space = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
    profiles = synthetic_profiles(space.candidates(), example_params())
    profiles["eval_time_s"] = np.where(profiles["global_batch"] == 32, 0.5, np.nan)
    plan = build_plan(space, profiles, epochs=2, dataset_size=4096, objective="time",
                      eval_at_local_batch=True)
    plan.to_json(tmp_path / "plan.json")
    assert main(["replay", str(tmp_path / "plan.json"), "--objective", "time",
                 "--out", str(tmp_path / "again")]) == 0
    again = Plan.from_json(tmp_path / "again" / "plan.json").table
    assert again["eval_time_s"].to_numpy() == pytest.approx(plan.table["eval_time_s"].to_numpy())
    assert plan.table["eval_time_s"].nunique() > 2


def test_train_prints_the_plan_beside_the_run(monkeypatch, tmp_path, capsys):
    """A fixed batch's run ends with the plan's training and evaluation seconds per epoch
    beside its own (issue 43; train itself replaced by its result)."""
    import pandas as pd

    import tula_ray.runs.train as train_module
    from tula_ray.planning.run_check import Planned

    metrics = pd.DataFrame({"epoch": [0, 1], "steps": [50, 50], "seconds": [2.0, 1.0],
                            "eval_seconds": [0.5, 0.4], "train_loss": [1.0, 0.5]})
    result = train_module.TrainResult(metrics, None, None, 1, 32, "lbt", [],
                                      planned=Planned(0.022, 0.44, to_target=False))
    monkeypatch.setattr(train_module, "train", lambda plan, **kwargs: result)
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert main(["train", str(plan), "--out", str(tmp_path / "out")]) in (0, None)
    printed = capsys.readouterr().out
    assert ("against the plan (epochs after the first, median): training s per epoch 1, "
            "planned 1.1 (1.10x); evaluation s per epoch 0.4, planned 0.44 (1.10x)") in \
        " ".join(printed.split())
