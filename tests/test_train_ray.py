"""tula_ray.train() on local Ray: the plan's choice as a Ray Train job, checkpoints, recovery.

The plan is built offline (synthetic profiles) so that its choice is N = 2,
B = 64; the job trains the real CNN on a 1024-image subset of the real
Fashion-MNIST for 2 epochs, which the plan's meta records as workload options.
"""

import math
import sys

import pytest
import ray.cloudpickle as cloudpickle
import torch
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray import SearchSpace, build_plan
from tula_ray.planning.synthetic import example_params, synthetic_profiles
from tula_ray.training.checkpoints import restore_state
from tula_ray.training.strategies import build_strategy
from tula_ray.workloads import Workload, get_workload

pytestmark = pytest.mark.ray

# Ray workers cannot import this test module: its functions travel by value, as a
# driver script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TRAIN_SUBSET = 1024
EPOCHS = 2
CHOSEN_N, CHOSEN_B = 2, 64
# Each rank's share of the subset in local batches of B / N (drop_last).
STEPS_PER_EPOCH = TRAIN_SUBSET // CHOSEN_N // (CHOSEN_B // CHOSEN_N)


def _plan(cluster_sizes=(CHOSEN_N,), batch_sizes=(32, CHOSEN_B), workload="fashion-mnist-cnn",
          meta=None):
    """A plan whose choice (fastest, one N only) is the largest batch."""
    space = SearchSpace(cluster_sizes, batch_sizes)
    profiles = synthetic_profiles(space.candidates(), example_params())
    return build_plan(space, profiles, epochs=EPOCHS, dataset_size=TRAIN_SUBSET,
                      search_strategy="full", objective="time", workload=workload,
                      meta={"workload_options": {"train_subset": TRAIN_SUBSET}}
                      if meta is None else meta)


@pytest.fixture(scope="module")
def plan():
    plan = _plan()
    assert (plan.choice.num_workers, plan.choice.global_batch) == (CHOSEN_N, CHOSEN_B)
    return plan


@pytest.fixture(scope="module")
def trained(ray_session, plan, tmp_path_factory):
    """The plan's choice trained with AGS, a worker failing at epoch 1 (a restart from the
    last checkpoint). That the interrupted run is the uninterrupted one, step for step, is
    the training loop's own test without Ray (tests/test_training.py,
    test_a_resumed_run_continues_identically): here, Ray Train's restart."""
    return tula_ray.train(plan, "ags", storage_path=str(tmp_path_factory.mktemp("recover")),
                          name="ags-fail", fail_at_epoch=1, keep_checkpoints=1,
                          collective_timeout_s=120)


def test_train_runs_the_plans_choice_for_its_epochs(trained):
    metrics = trained.metrics
    assert list(metrics["epoch"]) == [0, 1]
    assert (trained.num_workers, trained.global_batch, trained.strategy) == (2, 64, "ags")
    assert metrics["num_workers"].eq(2).all() and metrics["global_batch"].eq(64).all()
    # b = 32 leaves no room for AGS's default 32-sample sub-batch: the local gradients serve.
    assert any("source='local'" in note for note in trained.notes)
    # The plan's workload options reached the workers: 1024 images, not 60000.
    assert metrics["steps"].eq(STEPS_PER_EPOCH).all()
    for column in ("train_loss", "train_accuracy", "test_loss", "test_accuracy",
                   "scaled_fraction"):
        assert metrics[column].map(math.isfinite).all(), column
    assert metrics["train_accuracy"].between(0, 1).all()
    assert metrics["test_accuracy"].between(0, 1).all()
    assert metrics["train_loss"].iloc[1] < metrics["train_loss"].iloc[0]  # it learns
    # The plan beside the run (its second epoch): the plan's step times its steps; the
    # synthetic profiles measured no evaluation pass, so none is compared.
    against = trained.against_plan()
    assert list(against["what"]) == ["training s per epoch"]
    assert against["measured"].iloc[0] == metrics["seconds"].iloc[1]
    assert against["planned"].iloc[0] == pytest.approx(
        trained.planned.step_s * STEPS_PER_EPOCH)


def test_the_last_checkpoint_loads_into_a_fresh_model_and_optimizer(trained):
    state = trained.load_checkpoint()
    assert state["epoch"] == EPOCHS - 1 and state["strategy"] == "ags"
    workload = get_workload("fashion-mnist-cnn", train_subset=TRAIN_SUBSET)
    model = workload.model_fn()
    setup = build_strategy("ags", model, global_batch=CHOSEN_B,
                           steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS)
    assert restore_state(state, model, setup) == EPOCHS  # the next epoch to run
    restored = setup.optimizer.state_dict()
    assert restored["base_state"]  # SGD's momentum buffers
    assert all("scale" in state for state in restored["state"].values())  # AGS's scales
    assert restored["ags"]["counters"]["steps"] == EPOCHS * STEPS_PER_EPOCH


def test_a_worker_failure_resumes_from_the_last_checkpoint(trained):
    metrics = trained.metrics
    assert list(metrics["epoch"]) == [0, 1]
    # Epoch 0 ran once, in the first attempt; epoch 1 ran after the restart, from its checkpoint.
    assert list(metrics["resumed_from"]) == [-1, 0]
    assert trained.load_checkpoint()["epoch"] == 1


def test_only_the_last_checkpoints_stay_and_every_epochs_metrics_with_them(trained):
    """Issue 45, item 5: `keep_checkpoints=1` leaves one checkpoint in storage (cloud
    storage bills each), and the metrics of both epochs still come back (epoch 0's from
    the history the last checkpoint carries: its own checkpoint is gone)."""
    from pathlib import Path

    kept = sorted(p.name for p in Path(trained.result.path).glob("checkpoint_epoch_*"))
    assert kept == ["checkpoint_epoch_0001"]
    assert list(trained.metrics["epoch"]) == [0, 1]


@pytest.mark.parametrize("plan_kwargs, train_kwargs, message", [
    ({}, dict(strategy="sgd"), r"strategy 'sgd' is unknown; use one of \('ags', "),
    ({}, dict(strategy="ags", strategy_options={"deltaa": 0.3}),
     "option 'deltaa' is unknown for strategy 'ags'"),
    ({}, dict(strategy_options={"s_min": -1.0}), r"s_min=-1.0: need 0 <= s_min"),
    (dict(workload="synthetic", meta={}), {}, "the plan does not record a workload"),
    (dict(cluster_sizes=(4,)), {}, "cluster size 4 is larger than the cluster's 2 CPUs"),
    ({}, dict(epochs=0), "epochs=0; it must be an integer >= 1"),
    ({}, dict(target_accuracy=1.5), r"target_accuracy=1\.5"),
    ({}, dict(validation_fraction=0.2), r"validation_fraction=0\.2 is only used with a target"),
    ({}, dict(target_accuracy=0.9, validation_fraction=1.0), r"validation_fraction=1\.0"),
    ({}, dict(eval_every_samples=100), "eval_every_samples=100 is only used with a target"),
    ({}, dict(keep_checkpoints=0), "keep_checkpoints=0"),
    ({}, dict(collective_timeout_s=0), "collective_timeout_s=0"),
    (dict(batch_sizes=(32, 128)), dict(strategy="ags", strategy_options={"small_batch": 64}),
     "ags takes its small-batch gradient from 64 samples .* needs fewer than 64"),
    (dict(batch_sizes=(32, 128)),  # the default strategy, ags-ns
     dict(strategy_options={"source": "sub-batch", "small_batch": 64}),
     "ags-ns takes its small-batch gradient from 64 samples .* needs fewer than 64"),
])
def test_bad_input_fails_before_any_worker(ray_session, tmp_path, plan_kwargs, train_kwargs,
                                           message):
    with pytest.raises(ValueError, match=message):
        tula_ray.train(_plan(**plan_kwargs), storage_path=str(tmp_path), **train_kwargs)
    assert not list(tmp_path.iterdir())  # no Train run was started


def test_train_gives_ray_train_its_collective_timeout_and_the_checkpoints_to_keep(
        ray_session, plan, monkeypatch, tmp_path):
    """Issue 45, item 5: a hung collective fails the job after `collective_timeout_s`
    (default 600 s, not torch's 1800), and storage keeps the last `keep_checkpoints`
    (default 2). What reaches Ray Train is checked; the launch itself is stopped."""
    import tula_ray.runs.train as train_module

    given = []

    class Stop(Exception):
        pass

    def trainer(loop, **kwargs):
        given.append(kwargs)
        raise Stop

    monkeypatch.setattr(train_module, "TorchTrainer", trainer)
    for kwargs in ({}, {"keep_checkpoints": 5, "collective_timeout_s": 90.5}):
        with pytest.raises(Stop):
            tula_ray.train(plan, storage_path=str(tmp_path), **kwargs)
    (default, chosen) = given
    assert default["torch_config"].timeout_s == train_module.COLLECTIVE_TIMEOUT_S_DEFAULT == 600
    assert default["run_config"].checkpoint_config.num_to_keep == 2
    assert chosen["torch_config"].timeout_s == 91
    assert chosen["run_config"].checkpoint_config.num_to_keep == 5


def test_train_takes_a_plans_choice_at_agss_reference_batch():
    """Issue 22, item 6: a plan that chose B = 32 on N = 2 (the demo's smallest candidate),
    trained with the default strategy, AGS-NS, whose reference batch is 32: it used to be
    refused ("ags-ns's reference small batch 32 needs a larger global batch"); the gain is
    1 there, and the job trains plain SGD steps, saying so (decided in the driver, before
    Ray: `resolve_job`; the workers build the plain SGD: tests/test_ags_variant.py)."""
    from tula_ray.runs.training_job import resolve_job
    from tula_ray.training.strategies import TRAINING_STRATEGY_DEFAULT

    plan = _plan(batch_sizes=(16, 32))
    assert (plan.choice.num_workers, plan.choice.global_batch) == (2, 32)
    job = resolve_job(plan, TRAINING_STRATEGY_DEFAULT, None, None, 1, None)
    assert job.strategy_name == "ags-ns" == TRAINING_STRATEGY_DEFAULT
    assert (job.num_workers, job.global_batch) == (2, 32)
    assert any("plain steps of the workload's optimizer" in note for note in job.notes)


def user_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                         nn.Flatten(), nn.Linear(8 * 4 * 4, 4))


def user_images(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn((count, 1, 12, 12), generator=generator),
                         torch.randint(0, 4, (count,), generator=generator))


def user_adam(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3)


# A user's own model and data (made-up: fp16 is emulated on the CPU, slow, and what is
# checked is the path through Ray Train, not what it learns), trained with their Adam.
USER_ADAM = Workload("user-adam", user_model, lambda: user_images(TRAIN_SUBSET, 0),
                     lambda: user_images(256, 1), optimizer_fn=user_adam)


def test_train_in_fp16_to_a_scale_invariant_budget(ray_session, tmp_path):
    """Issue 24, item 4: fp16 through Ray Train, AGS-NS's local source reading the scaled
    gradients of two workers; every epoch reports the loss scale it ended with.
    Issue 25, item 3 in the same run (one Ray Train job, not two): the scale-invariant
    budget of 1 epoch at AGS-NS's reference batch 32 trains B = 64 until its progress
    reaches 1024 / 32 reference steps: 1 or 2 epochs.
    Issue 41, item 1 in the same run: the user's Workload trains its own Adam, inside
    AGS-NS's TulaOptimizer on every worker, and Adam's state is in the checkpoint."""
    result = tula_ray.train(_plan(workload="user-adam", meta={}), "ags-ns", epochs=1,
                            workload=USER_ADAM, precision="fp16", budget="scale-invariant",
                            storage_path=str(tmp_path))
    metrics = result.metrics
    assert metrics["optimizer"].eq("TulaOptimizer(Adam)").all()
    adam_state = result.load_checkpoint()["optimizer"]["base_state"]
    assert adam_state and all({"exp_avg", "exp_avg_sq"} <= set(s) for s in adam_state.values())
    assert metrics["loss_scale"].gt(0).all() and metrics["loss_scale"].map(math.isfinite).all()
    assert metrics["test_accuracy"].between(0, 1).all()
    assert result.load_checkpoint()["loss_scaler"]["scale"] == metrics["loss_scale"].iloc[-1]
    target = TRAIN_SUBSET / 32
    progress = metrics["progress"].tolist()
    assert 1 <= len(progress) <= CHOSEN_B // 32
    assert progress[-1] >= target and all(p < target for p in progress[:-1])
    assert result.load_checkpoint()["optimizer"]["ags"]["progress"] == pytest.approx(
        progress[-1])


def test_train_time_benchmark_quick(ray_session):
    """Issue 24's benchmark, smoke test: a plan against `train`'s epochs, and the report.
    The plan is given (profiles made from a known model, with an evaluation and a
    checkpoint measured): what follows a search is what is smoke-tested; searches are
    tests/test_search_ray.py's."""
    from result_checks import table_rows

    from benchmarks.prediction import train_time
    from benchmarks.common import RESULTS_DIR

    label, workload, options, _, (batch,) = train_time.QUICK_WORKLOADS[0]
    space = SearchSpace((1,), (batch,))
    profiles = synthetic_profiles(space.candidates(), example_params()).assign(
        eval_time_s=0.05, checkpoint_time_s=0.01, data_load_s=0.1)
    plan = build_plan(space, profiles, epochs=train_time.QUICK_EPOCHS,
                      dataset_size=options["train_subset"], search_strategy="full",
                      objective="time", workload=workload, meta={"workload_options": options,
                                               "training_strategy": "lbt"})
    result = train_time.run(quick=True, plans={label: plan})
    (row,) = result["rows"]
    assert row["measured_s"] > 0 and row["predicted_s"] > 0 and row["eval_predicted_s"] > 0
    markdown = (RESULTS_DIR / "train_time_quick.md").read_text()
    assert len(table_rows(markdown, "| workload | N | B |")) == 1
    # Every run records the tree it trained at (a resumed run mixes commits).
    assert list(result["run_commits"]["grid"].values()) == [1]
    assert "not recorded" not in result["run_commits"]["grid"]
    assert "- The grid's runs trained at: " in markdown
