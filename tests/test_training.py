"""The training loop: one epoch per strategy, evaluation, fit's table, exact resume."""

import dataclasses
import io
import math

import pandas as pd
import pytest
import torch
from torch import nn

from tula_ray.training.strategies import TRAINING_STRATEGIES, build_strategy
from tula_ray.training.run import COLUMNS, fit
from tula_ray.training.strategies import optimizer_hyperparameters as strategy_hyperparameters
from tula_ray.training.checkpoints import checkpoint_state, restore_state
from tula_ray.training.epochs import evaluate, train_epoch
from tula_ray.training.data import make_loaders
from tula_ray.workloads import get_workload

FAKE_SIZE, BATCH = 128, 32  # 4 steps per epoch
AGS_OPTIONS = {"small_batch": 8}  # the default 32 needs a local batch above 32


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The machine is shared: 2 threads on oversubscribed cores run these tiny steps ~10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def workload():
    """FakeData, decoded once for the module (each run would otherwise rebuild it)."""
    fake = get_workload("fashion-mnist-cnn", data="fake", fake_size=FAKE_SIZE)
    train, test = fake.train_dataset_fn(), fake.test_dataset_fn()
    return dataclasses.replace(fake, train_dataset_fn=lambda: train, test_dataset_fn=lambda: test)


def _start(workload, strategy, *, epochs, options=None, init_seed=0, data_seed=0):
    """A fresh (model, setup, train loader, test loader) as a training run builds them."""
    if strategy.startswith("ags"):
        options = {**AGS_OPTIONS, **(options or {})}
    torch.manual_seed(init_seed)
    model = workload.model_fn()
    train_loader, test_loader = make_loaders(workload, BATCH, seed=data_seed)
    setup = build_strategy(strategy, model, global_batch=BATCH, steps_per_epoch=len(train_loader),
                           epochs=epochs, options=options)
    return model, setup, train_loader, test_loader


@pytest.mark.parametrize("strategy", TRAINING_STRATEGIES)
def test_each_strategy_trains_one_epoch_with_finite_metrics(workload, strategy):
    model, setup, train_loader, test_loader = _start(workload, strategy, epochs=1)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = train_epoch(model, setup, nn.CrossEntropyLoss(), train_loader, "cpu", epoch=0)
    metrics.update(evaluate(model, test_loader, "cpu", nn.CrossEntropyLoss()))
    assert metrics["steps"] == FAKE_SIZE // BATCH
    for key in ("train_loss", "test_loss", "lr", "seconds"):
        assert math.isfinite(metrics[key]) and metrics[key] > 0, key
    for key in ("train_accuracy", "test_accuracy"):
        assert 0.0 <= metrics[key] <= 1.0, key
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    if strategy.startswith("ags"):
        assert 0.0 <= metrics["scaled_fraction"] <= 1.0
        assert len(metrics["variability"]) == metrics["steps"]
        assert all(isinstance(v, float) for v in metrics["variability"])
        assert metrics["variability"][0] == math.inf  # the run's first step has no previous norm
        assert math.isfinite(metrics["variability_median"])
    else:
        assert "scaled_fraction" not in metrics and "variability" not in metrics


def test_evaluate_counts_every_test_sample_and_keeps_the_mode(workload):
    model, _, _, test_loader = _start(workload, "lbt", epochs=1)
    model.train()
    result = evaluate(model, test_loader, "cpu", nn.CrossEntropyLoss())
    assert model.training
    with torch.no_grad():
        inputs, targets = test_loader.dataset[:]
        outputs = model.eval()(inputs)
    expected_loss = nn.functional.cross_entropy(outputs, targets).item()
    assert result["test_loss"] == pytest.approx(expected_loss)
    accuracy = (outputs.argmax(1) == targets).float().mean().item()
    assert result["test_accuracy"] == pytest.approx(accuracy)


def test_the_data_order_depends_on_seed_and_epoch_only(workload):
    def first_labels(seed, epoch):
        loader, _ = make_loaders(workload, BATCH, seed=seed)
        loader.sampler.set_epoch(epoch)
        return next(iter(loader))[1]

    assert torch.equal(first_labels(0, 1), first_labels(0, 1))
    assert not torch.equal(first_labels(0, 0), first_labels(0, 1))
    assert not torch.equal(first_labels(0, 1), first_labels(1, 1))


@pytest.mark.parametrize("strategy, options", [("ags", {"refresh_every": 3}), ("lrs", None),
                                               ("lars", None), ("polo", None)])
def test_a_resumed_run_continues_identically(workload, strategy, options):
    loss_fn = nn.CrossEntropyLoss()
    model, setup, loader, _ = _start(workload, strategy, epochs=3, options=options)
    for epoch in range(3):
        train_epoch(model, setup, loss_fn, loader, "cpu", epoch=epoch)
    straight = [p.detach().clone() for p in model.parameters()]

    model, setup, loader, _ = _start(workload, strategy, epochs=3, options=options)
    for epoch in range(2):
        train_epoch(model, setup, loss_fn, loader, "cpu", epoch=epoch)
    buffer = io.BytesIO()
    torch.save(checkpoint_state(model, setup, epoch=1), buffer)  # a plain, saveable dict
    del model, setup, loader

    # Rebuilt from scratch, with another initialisation that the checkpoint overrides.
    model, setup, loader, _ = _start(workload, strategy, epochs=3, options=options, init_seed=7)
    buffer.seek(0)
    next_epoch = restore_state(torch.load(buffer, weights_only=False), model, setup)
    assert next_epoch == 2
    last = train_epoch(model, setup, loss_fn, loader, "cpu", epoch=next_epoch)
    resumed = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    if strategy == "ags":
        assert setup.optimizer.telemetry["steps"] == 12 and last["steps"] == 4


def test_checkpoint_is_a_snapshot_not_a_live_view(workload):
    model, setup, loader, _ = _start(workload, "lbt", epochs=2)
    train_epoch(model, setup, nn.CrossEntropyLoss(), loader, "cpu", epoch=0)
    state = checkpoint_state(model, setup, epoch=0)
    saved = {k: v.clone() for k, v in state["model"].items()}
    train_epoch(model, setup, nn.CrossEntropyLoss(), loader, "cpu", epoch=1)
    assert all(torch.equal(saved[k], state["model"][k]) for k in saved)


def test_checkpoints_are_cpu_copies_and_cpu_batches_are_not_pinned(workload):
    model, setup, loader, _ = _start(workload, "ags", epochs=1)
    train_epoch(model, setup, nn.CrossEntropyLoss(), loader, "cpu", epoch=0)
    state = checkpoint_state(model, setup, epoch=0)
    live = dict(model.state_dict())
    for key, tensor in state["model"].items():
        assert tensor.device.type == "cpu" and tensor.data_ptr() != live[key].data_ptr()
    scales = [s["scale"] for s in state["optimizer"]["state"].values()]
    assert scales and all(s.device.type == "cpu" for s in scales)
    # On CPU the batches are gathered from the tensors in place: nothing pinned or copied.
    assert loader.path == "gather-host" and not loader.pin_memory


def test_restore_refuses_another_strategy_or_a_foreign_dict(workload):
    model, setup, _, _ = _start(workload, "lrs", epochs=2)
    state = checkpoint_state(model, setup, epoch=0)
    other_model, other, _, _ = _start(workload, "lbt", epochs=2)
    with pytest.raises(ValueError, match="strategy 'lrs' cannot resume a 'lbt' run"):
        restore_state(state, other_model, other)
    with pytest.raises(ValueError, match="not a training checkpoint"):
        restore_state({"model": {}}, model, setup)


def test_fit_returns_one_row_per_epoch(workload):
    seen = []
    frame = fit(workload, global_batch=BATCH, strategy="ags", epochs=2, seed=3, options=AGS_OPTIONS,
                on_epoch=lambda metrics, model, setup: seen.append(metrics))
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == list(COLUMNS)
    assert frame["epoch"].tolist() == [0, 1] and set(frame["strategy"]) == {"ags"}
    assert set(frame["global_batch"]) == {BATCH} and set(frame["seed"]) == {3}
    assert set(frame["optimizer"]) == {"TulaOptimizer(SGD)"}  # the workload's, wrapped
    assert frame["lr"].tolist() == [0.01, 0.01]  # lr=None: the workload's (paper §IV-B)
    assert frame["scaled_fraction"].between(0, 1).all()
    assert frame.drop(columns=["strategy", "optimizer", "loss_scale", "progress"]).map(
        math.isfinite).all().all()
    assert frame["loss_scale"].isna().all()  # fp32: no loss scaler
    assert frame["progress"].isna().all()  # the paper's AGS keeps no running gain
    assert [len(m["variability"]) for m in seen] == [4, 4]
    assert frame.attrs["notes"] == []


def test_fit_baselines_use_the_given_lr_and_report_nan_scaling(workload):
    frame = fit(workload, global_batch=BATCH, strategy="lbt", epochs=1, lr=0.03)
    assert frame["lr"].tolist() == [0.03]
    assert frame["scaled_fraction"].isna().all()
    again = fit(workload, global_batch=BATCH, strategy="lbt", epochs=1, lr=0.03)
    pd.testing.assert_frame_equal(frame.drop(columns="seconds"), again.drop(columns="seconds"))
    polo = fit(workload, global_batch=BATCH, strategy="polo", epochs=1)
    assert any("world size 1" in note for note in polo.attrs["notes"])


@pytest.mark.parametrize("kwargs, message", [
    ({"global_batch": 0}, "global_batch=0"),
    ({"global_batch": FAKE_SIZE + 1}, "exceeds the training set"),
    ({"global_batch": BATCH, "strategy": "sgd"}, "strategy 'sgd' is unknown"),
    ({"global_batch": BATCH, "options": {"delta": 0.5}, "strategy": "lars"}, "option 'delta'"),
])
def test_fit_refuses_bad_inputs(workload, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fit(workload, epochs=1, **kwargs)


def optimizer_hyperparameters(workload):
    return strategy_hyperparameters(workload.optimizer_fn)


def test_optimizer_hyperparameters_follow_the_workload():
    assert optimizer_hyperparameters(get_workload("resnet50", data="fake"))["lr"] == 0.05
    mobilenet = optimizer_hyperparameters(get_workload("mobilenet_v3_small", data="fake"))
    assert mobilenet == {"lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4}  # paper §IV-B
    cnn = get_workload("fashion-mnist-cnn", data="fake")
    custom = dataclasses.replace(cnn, optimizer_fn=lambda params: torch.optim.SGD(params, lr=0.1))
    assert optimizer_hyperparameters(custom) == {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}
    adam = dataclasses.replace(cnn, optimizer_fn=lambda params: torch.optim.Adam(params, lr=1e-3))
    assert optimizer_hyperparameters(adam) == {"lr": 1e-3, "momentum": 0.9, "weight_decay": 0.0}


def test_evaluation_estimate_leaves_out_the_first_batchs_one_off_cost():
    """The profile's evaluation pass (two batches timed, scaled to the test set) runs one
    batch untimed first: a one-off cost there (here a 0.5 s first forward) is paid in
    `train`'s first epoch only, not in the later ones the plan predicts."""
    import time

    from torch.utils.data import TensorDataset

    from tula_ray.training.epoch_costs import evaluation_s

    class SlowFirstForward(nn.Linear):
        calls = 0

        def forward(self, inputs):
            SlowFirstForward.calls += 1
            if SlowFirstForward.calls == 1:
                time.sleep(0.5)
            return super().forward(inputs)

    eval_batch = 1000
    test_set = TensorDataset(torch.randn(10 * eval_batch, 4),
                             torch.randint(0, 3, (10 * eval_batch,)))
    seconds = evaluation_s(SlowFirstForward(4, 3), test_set, nn.CrossEntropyLoss(),
                           torch.device("cpu"), eval_batch=eval_batch)
    # the untimed pass, then passes of 1 and of 10 batches (short batches: every one)
    assert SlowFirstForward.calls == 1 + 1 + 10
    assert 0 < seconds < 0.5  # from fast batches: far below the sleep


def test_the_evaluation_estimate_counts_a_pass_s_fixed_cost_once(monkeypatch):
    """A pass's fixed cost (its all-reduce, the wait for the other ranks; here a 50 ms
    sleep in every `evaluate`) is counted once, not once per probe: a 2-batch pass scaled
    to 20 batches read 10 x 50 ms."""
    import time

    from torch.utils.data import TensorDataset

    from tula_ray.training import epoch_costs

    real = epoch_costs.evaluate

    def slow_to_agree(*args, **kwargs):
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(epoch_costs, "evaluate", slow_to_agree)
    test_set = TensorDataset(torch.randn(20 * 50, 4), torch.randint(0, 3, (20 * 50,)))
    seconds = epoch_costs.evaluation_s(nn.Linear(4, 3), test_set, nn.CrossEntropyLoss(),
                                       torch.device("cpu"), eval_batch=50)
    assert 0.045 < seconds < 0.15  # one fixed cost and 20 fast batches


class _TakesAtMost(nn.Module):
    """The CNN behind a forward that asserts its batch, in training or in evaluation."""

    def __init__(self, most: int, training: bool) -> None:
        super().__init__()
        self.most, self.when_training, self.cnn = most, training, get_workload(
            "fashion-mnist-cnn", data="fake").model_fn()

    def forward(self, inputs):
        if self.training == self.when_training:
            assert len(inputs) <= self.most, f"batch {len(inputs)} > {self.most}"
        return self.cnn(inputs)


def test_evaluation_runs_at_the_training_batch_or_the_workloads_eval_batch(workload):
    """Issue 41, item 4: no fixed, larger evaluation batch a model may refuse."""
    from tula_ray.training.data import evaluation_batch

    _, test = make_loaders(workload, 16, seed=0)
    assert test.batch == evaluation_batch(workload, 16) == 16
    _, test = make_loaders(workload, 8, seed=0, num_replicas=2, rank=1)
    assert test.batch == 8  # the local batch, B / N
    given = dataclasses.replace(workload, eval_batch=40)
    _, test = make_loaders(given, 16, seed=0)
    assert test.batch == evaluation_batch(given, 16) == 40


def test_the_evaluation_estimate_runs_at_the_batch_train_evaluates_in(workload):
    """The profile's evaluation pass (epoch_costs) sees the batches `train`'s does."""
    from torch.utils.data import TensorDataset

    from tula_ray.training.data import evaluation_batch
    from tula_ray.training.epoch_costs import evaluation_s

    seen = []

    class Recording(nn.Linear):
        def forward(self, inputs):
            seen.append(len(inputs))
            return super().forward(inputs)

    test_set = TensorDataset(torch.randn(200, 4), torch.randint(0, 3, (200,)))
    for given, local_batch in ((None, 16), (40, 16)):
        seen.clear()
        eval_batch = evaluation_batch(dataclasses.replace(workload, eval_batch=given),
                                      local_batch)
        evaluation_s(Recording(4, 3), test_set, nn.CrossEntropyLoss(), torch.device("cpu"),
                     eval_batch=eval_batch)
        batch = given or local_batch  # and the set's last, short one, as train's pass
        assert max(seen) == batch and set(seen) <= {batch, len(test_set) % batch}


@pytest.mark.parametrize("training, stage", [
    (False, "evaluation at batch 32 raised AssertionError: batch 32 > 16"),
    (True, "training at local batch 32 raised AssertionError: batch 32 > 16")])
def test_a_failure_names_its_stage_and_batch(workload, training, stage):
    """An evaluation failure is labelled evaluation (it used to read "training at B=32")."""
    from tula_ray.failures import UserCodeError

    limited = dataclasses.replace(workload, model_fn=lambda: _TakesAtMost(16, training))
    with pytest.raises(UserCodeError, match=f"workload '{workload.name}': {stage}"):
        fit(limited, global_batch=32, strategy="lbt", epochs=1)


def test_an_eval_batch_within_the_models_limit_evaluates(workload):
    limited = dataclasses.replace(workload, model_fn=lambda: _TakesAtMost(16, False),
                                  eval_batch=16)
    assert len(fit(limited, global_batch=32, strategy="lbt", epochs=1)) == 1
