"""tula_ray.tune_training(): Optuna + ASHA on Ray Tune, each trial a Ray Train job at the
plan's (N, B), judged on a split held out of the training set.

Fast part: the validation split, the search spaces, bad arguments refused before Ray.
Ray part (the run's shared Ray): a user's own tiny Workload, defined here (a built-in one is
tuned by `tula-ray tune` in tests/test_cli_ray.py).
"""

import sys
from types import SimpleNamespace


import pytest
import torch
from torch import nn
from ray import cloudpickle  # Ray serialises functions with its own copy
from ray.train import ControllerError, WorkerGroupError
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray import SearchSpace, build_plan
from tula_ray.planning.synthetic import example_params, synthetic_profiles
from tula_ray.training.data import split_validation
from tula_ray.training.strategies import TRAINING_STRATEGIES
from tula_ray.workloads import Workload

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests

CHOSEN_N, CHOSEN_B = 2, 64


def _plan(meta=None, workload="fashion-mnist-cnn"):
    space = SearchSpace((CHOSEN_N,), (32, CHOSEN_B))
    profiles = synthetic_profiles(space.candidates(), example_params())
    return build_plan(space, profiles, epochs=2, dataset_size=256, search_strategy="full",
                      objective="time", workload=workload, meta=meta if meta is not None else {
                          "workload_options": {"data": "fake", "fake_size": 256}})


def _tiny_data(train: bool) -> TensorDataset:
    generator = torch.Generator().manual_seed(0 if train else 1)
    inputs = torch.randn(320 if train else 64, 1, 28, 28, generator=generator)
    return TensorDataset(inputs, (inputs.mean(dim=(1, 2, 3)) > 0).long())


def _tiny_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 2))


def user_workload() -> Workload:
    """What a user brings: their own model and data, defined in their driver."""
    return Workload(name="user-tiny", model_fn=_tiny_model,
                    train_dataset_fn=lambda: _tiny_data(True),
                    test_dataset_fn=lambda: _tiny_data(False), epochs=2, num_classes=2)


# --------------------------------------------------------------------------- no Ray

def test_the_validation_split_is_held_out_of_the_training_set_with_a_fixed_seed():
    dataset = TensorDataset(torch.arange(100))
    train, validation = split_validation(dataset, 0.2)
    assert len(validation) == 20 and len(train) == 80
    assert not set(train.indices) & set(validation.indices)
    assert split_validation(dataset, 0.2)[1].indices == validation.indices  # the same each time
    with pytest.raises(ValueError, match="validation_fraction=1.0"):
        split_validation(dataset, 1.0)


def test_every_strategy_has_a_search_space_of_its_own_options():
    spaces = {name: strategy.search_space(1024) for name, strategy in TRAINING_STRATEGIES.items()}
    for name, space in spaces.items():
        assert "lr" in space and set(space) <= {"lr", *TRAINING_STRATEGIES[name].options}, name
    assert set(spaces["lars"]) == {"lr", "trust_coefficient"}
    assert set(spaces["ags"]) == {"lr", "delta", "gain_exponent", "s_max"}
    assert None in spaces["ags"]["delta"][1]  # the gate off is a candidate
    assert spaces["ags"]["s_max"] == ("loguniform", 1.0, 32.0)  # up to AdaScale's B / 32


@pytest.mark.parametrize("kwargs, error, message", [
    ({"trials": 0}, ValueError, "trials=0"),
    ({"validation_fraction": 0.0}, ValueError, "validation_fraction=0.0"),
    ({"strategy": "sgd"}, ValueError, "strategy 'sgd' is unknown"),
    ({"epochs": 0}, ValueError, "epochs=0"),
    ({"grace_period": 5}, ValueError, "grace_period=5 exceeds the 2 epochs"),
    ({"seed": 1.5}, TypeError, "seed=1.5"),
    ({"budget": "steps"}, ValueError, "budget='steps'"),
])
def test_bad_arguments_fail_before_ray_starts(kwargs, error, message):
    import ray

    with pytest.raises(error, match=message):
        tula_ray.tune_training(_plan(), **kwargs)
    assert not ray.is_initialized()


def test_a_scale_invariant_trial_is_finished_when_its_progress_reaches_the_epochs():
    from tula_ray.runs.tune_training import EPOCH_TIME, PROGRESS_TIME, asha, finished

    assert finished({"epoch": 1}, 2) and not finished({"epoch": 0}, 2)
    # counted in progress, the epoch number says nothing: a trial at B > 32 may take more
    assert finished({"epoch": 3, PROGRESS_TIME: 2.01}, 2, PROGRESS_TIME)
    assert not finished({"epoch": 1, PROGRESS_TIME: 1.5}, 2, PROGRESS_TIME)
    assert not finished(None, 2) and not finished({"epoch": -1}, 2, PROGRESS_TIME)
    assert asha(2, 1, PROGRESS_TIME)._time_attr == PROGRESS_TIME
    assert asha(2, 1)._time_attr == EPOCH_TIME


class _FailingTrainer:
    """Stands in for TorchTrainer in a trial: keeps its failure config, fails to fit."""

    def __init__(self, error, *args, **kwargs):
        self.error, self.failure_config = error, kwargs["run_config"].failure_config
        _FailingTrainer.last = self

    def fit(self):
        raise self.error


@pytest.mark.parametrize("error, is_the_configurations", [
    (WorkerGroupError("rank 0 died: loss is nan", {0: RuntimeError("nan")}), True),
    (ControllerError(RuntimeError("worker group startup timed out")), False),
])
def test_a_trial_scores_a_crashing_configuration_0_but_errors_when_its_workers_never_start(
        monkeypatch, error, is_the_configurations):
    from trainables import tuning_trial

    reports = []
    monkeypatch.setattr(tuning_trial, "TorchTrainer",
                        lambda *a, **k: _FailingTrainer(error, *a, **k))
    monkeypatch.setattr(tuning_trial.tune, "get_context",
                        lambda: type("Context", (), {"get_trial_dir": lambda self: "/tmp"})())
    monkeypatch.setattr(tuning_trial.tune, "report", reports.append)
    # No Tune session here: the reporting fit (no callback) and Train's run config are
    # stand-ins.
    monkeypatch.setattr(tuning_trial, "TuneReports", lambda: SimpleNamespace(
        callbacks=[], fit=lambda trainer: trainer.fit()))
    monkeypatch.setattr(tuning_trial, "RunConfig", SimpleNamespace)
    fixed = {"workload": "fashion-mnist-cnn", "workload_options": {}, "global_batch": 64,
             "epochs": 1, "strategy": "lrs", "strategy_options": {}, "seed": 0,
             "validation_fraction": 0.2, "num_workers": 2, "use_gpu": False,
             "resources": {"CPU": 1}}
    if is_the_configurations:
        tuning_trial.tune_trial({"lr": 10.0}, fixed)
        assert reports[0][tuning_trial.METRIC] == tuning_trial.FAILED_ACCURACY
        assert "nan" in reports[0]["error"]
    else:  # Tune marks the trial ERROR: no score is made up for a fault of the cluster
        with pytest.raises(ControllerError):
            tuning_trial.tune_trial({"lr": 10.0}, fixed)
        assert not reports
    # A worker group that never starts is retried a bounded number of times, not forever.
    limit = _FailingTrainer.last.failure_config.controller_failure_limit
    assert 0 <= limit == tuning_trial.WORKER_GROUP_START_RETRIES


# --------------------------------------------------------------------------- local Ray

@pytest.mark.ray
def test_tuning_a_users_workload_to_a_scale_invariant_budget(ray_session, tmp_path):
    """A user's own Workload, tuned with ags-ns, whose space has options beyond the LR
    (issue 25, item 3): each trial trains until its progress reaches the epoch at the
    reference batch 32 (B = 64: one or two epochs), and reports it for ASHA. The best
    configuration is what `train` takes (`tula-ray train --config`: tests/test_cli_ray.py)."""
    workload = user_workload()
    best = tula_ray.tune_training(_plan(meta={}, workload="user-tiny"), "ags-ns", trials=2,
                                  epochs=1, workload=workload, budget="scale-invariant",
                                  storage_path=str(tmp_path))
    space = TRAINING_STRATEGIES["ags-ns"].search_space(CHOSEN_B)
    assert set(best.config) == {"strategy", "lr", "strategy_options"}
    assert best.config["strategy"] == "ags-ns"
    assert space["lr"][1] <= best.config["lr"] <= space["lr"][2]
    assert set(space) - {"lr"} <= set(best.config["strategy_options"])  # tuned, and fixed ones
    assert {f"config/{name}" for name in space} <= set(best.trials.columns)
    trials = best.trials
    assert len(trials) == 2 and trials["val_accuracy"].between(0, 1).all()
    assert trials["progress_epochs"].ge(1.0 - 1e-9).all()
    assert trials["epoch"].between(0, 1).all()  # at most B / 32 = 2 epochs
    assert 0.0 <= best.val_accuracy <= 1.0
    # The test set was never scored while tuning.
    assert not any(column.startswith("test_") for column in trials.columns)
