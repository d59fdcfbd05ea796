"""Strategies (paper §IV-D): what each builds, LR schedules, bad inputs, PoLo on 2 gloo ranks."""

import dataclasses
import os

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.common import spawn_gloo
from tula_ray.training.strategies import (BASE_BATCH_DEFAULT, TRAINING_STRATEGIES, WARMUP_EPOCHS_DEFAULT,
                                          BaseStrategy, StrategySetup, base_optimizer,
                                          build_strategy, get_training_strategy, linear_scaled_lr,
                                          register_training_strategy, unregister_training_strategy)
from tula_ray.workloads import FashionCNN, get_workload


def _build(name, global_batch=512, steps_per_epoch=4, epochs=10, **kwargs):
    torch.manual_seed(0)
    return build_strategy(name, FashionCNN(), global_batch=global_batch,
                          steps_per_epoch=steps_per_epoch, epochs=epochs, **kwargs)


def _lrs_over_steps(setup, steps):
    """The LR each of `steps` optimizer steps uses (no gradients: the steps change nothing)."""
    lrs = []
    for _ in range(steps):
        lrs.append(base_optimizer(setup.optimizer).param_groups[0]["lr"])
        setup.optimizer.step()
        setup.scheduler.step()
    return lrs


def test_each_strategy_builds_its_library_optimizer():
    from pytorch_optimizer import LARS

    from tula_ray.ags import TulaOptimizer

    built = {name: _build(name) for name in TRAINING_STRATEGIES}
    assert isinstance(built["ags"].optimizer, TulaOptimizer)
    assert isinstance(built["ags"].optimizer.base, torch.optim.SGD)
    assert built["ags"].optimizer.large_batch == 512 and built["ags"].optimizer.small_batch == 32
    assert type(built["lbt"].optimizer) is torch.optim.SGD and built["lbt"].scheduler is None
    assert built["lbt"].optimizer.defaults["lr"] == 0.01  # paper §IV-B, unchanged at large B
    assert isinstance(built["lars"].optimizer, LARS)
    assert isinstance(built["lrs"].scheduler, torch.optim.lr_scheduler.LinearLR)
    assert type(built["polo"].optimizer) is torch.optim.SGD  # world size 1
    assert all(not built[name].notes for name in ("ags", "lbt", "lrs", "lars"))


def test_polo_at_world_size_one_is_sgd_with_warmup_and_says_so():
    setup = _build("polo")
    assert setup.comm_state is None
    assert any("world size 1" in note for note in setup.notes)
    # Not scaled (§IV-D scales LRS and LARS only); warmed up like them, to the plain LR.
    lrs = _lrs_over_steps(setup, 24)
    assert lrs[0] == pytest.approx(0.01 * BASE_BATCH_DEFAULT / 512)
    assert lrs[20:] == pytest.approx([0.01] * 4)


@pytest.mark.parametrize("name", ["lrs", "lars"])
def test_linear_scaling_with_warmup_then_the_scaled_lr(name):
    setup = _build(name, global_batch=512, steps_per_epoch=4, options={"warmup_epochs": 2})
    peak = linear_scaled_lr(0.01, 512)
    assert peak == pytest.approx(0.04)  # 0.01 * 512 / 128
    lrs = _lrs_over_steps(setup, 12)
    warmup_steps = 8
    assert lrs[0] == pytest.approx(0.01)  # Goyal et al.: the warm-up starts at the unscaled LR
    assert lrs[4] == pytest.approx(0.01 + (peak - 0.01) * 4 / warmup_steps)
    assert lrs[warmup_steps:] == pytest.approx([peak] * 4)
    assert all(a < b for a, b in zip(lrs[:warmup_steps], lrs[1:warmup_steps + 1]))


def test_base_batch_option_and_no_ramp_below_it():
    setup = _build("lrs", global_batch=512, options={"base_batch": 256, "warmup_epochs": 1})
    assert _lrs_over_steps(setup, 6)[4:] == pytest.approx([0.02, 0.02])
    small = _build("lrs", global_batch=64, options={"warmup_epochs": 1})
    assert _lrs_over_steps(small, 6) == pytest.approx([0.005] * 6)  # scaled down, flat


def test_warmup_longer_than_the_run_is_clamped_with_a_note():
    setup = _build("lrs", epochs=2)  # default warm-up: 5 epochs
    assert any(f"from {WARMUP_EPOCHS_DEFAULT} to 2 epochs" in note for note in setup.notes)
    lrs = _lrs_over_steps(setup, 9)
    assert lrs[7] < 0.04 and lrs[8] == pytest.approx(0.04)  # reaches the peak at the run's end
    no_warmup = _build("lrs", options={"warmup_epochs": 0})
    assert no_warmup.scheduler is None
    assert no_warmup.optimizer.param_groups[0]["lr"] == pytest.approx(0.04)


def test_ags_options_reach_the_optimizer():
    setup = _build("ags", options={"delta": 0.3, "small_batch": 16, "refresh_every": 5,
                                   "granularity": "element", "s_max": 3.0, "s_min": 0.1})
    opt, group = setup.optimizer, setup.optimizer.param_groups[0]
    assert (group["delta"], opt.small_batch, opt.refresh_every, opt.granularity, group["s_max"],
            group["s_min"]) == (0.3, 16, 5, "element", 3.0, 0.1)


@pytest.mark.parametrize("name, kwargs, message", [
    ("adam", {}, r"strategy 'adam' is unknown; use one of \('ags'"),
    ("lrs", {"options": {"delta": 0.5}},
     r"option 'delta' is unknown for strategy 'lrs'.*base_batch"),
    ("lbt", {"options": {"warmup_epochs": 1}}, r"option 'warmup_epochs' .* allowed: none"),
    ("ags", {"options": {"warmup_epochs": 1}},
     "option 'warmup_epochs' is unknown for strategy 'ags'"),
    ("lbt", {"global_batch": 0}, "global_batch=0; it must be an integer >= 1"),
    ("lbt", {"steps_per_epoch": 0}, "steps_per_epoch=0"),
    ("lbt", {"lr": 0.0}, "lr=0.0"),
    ("lrs", {"options": {"base_batch": 0}}, "base_batch=0"),
    ("lrs", {"options": {"warmup_epochs": -1}}, "warmup_epochs=-1"),
    ("lars", {"options": {"trust_coefficient": 0.0}}, "trust_coefficient=0.0"),
    ("polo", {"options": {"averages_per_epoch": 0}}, "averages_per_epoch=0"),
    ("polo", {"options": {"switch_epoch": -1}}, "switch_epoch=-1"),
    ("ags", {"options": {"source": "local"}}, "source='local'.*world size is 1"),
    ("ags", {"options": {"delta": -1.0}}, "delta=-1.0"),  # TulaOptimizer's own check
])
def test_bad_inputs_name_the_value_and_what_is_allowed(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _build(name, **kwargs)


@pytest.mark.parametrize("name, kwargs, message", [
    ("lbt", {"global_batch": 64.0}, "global_batch=64.0; it must be an integer >= 1"),
    ("lbt", {"epochs": True}, "epochs=True; it must be an integer >= 1"),
    ("lbt", {"lr": "0.1"}, "lr='0.1'; it must be a number"),
    ("lrs", {"options": {"base_batch": 32.0}}, "base_batch=32.0; it must be an integer"),
    ("ags", {"options": [("delta", 0.5)]},
     r"options=\[\('delta', 0.5\)\]; it must be a dict or None \(the options of strategy 'ags'"),
])
def test_inputs_of_the_wrong_type_are_a_type_error(name, kwargs, message):
    with pytest.raises(TypeError, match=message):
        _build(name, **kwargs)


def test_the_registry_holds_the_five_and_each_names_its_options():
    assert list(TRAINING_STRATEGIES) == ["ags", "ags-ns", "lbt", "lrs", "lars", "polo"]
    assert TRAINING_STRATEGIES["lbt"].options == () and "trust_coefficient" in TRAINING_STRATEGIES["lars"].options
    assert "trust_coefficient" not in TRAINING_STRATEGIES["lrs"].options
    with pytest.raises(ValueError, match="'ags' is registered already"):
        register_training_strategy(TRAINING_STRATEGIES["ags"])
    with pytest.raises(TypeError, match="not a TrainingStrategy"):
        register_training_strategy(object())


def test_every_entry_point_defaults_to_one_registered_strategy():
    import inspect

    import tula_ray
    from tula_ray.training import run as training
    from tula_ray.training.strategies import TRAINING_STRATEGY_DEFAULT

    assert TRAINING_STRATEGY_DEFAULT in TRAINING_STRATEGIES
    defaults = {name: inspect.signature(function).parameters[parameter].default
                for name, function, parameter in (
                    ("train", tula_ray.train, "strategy"), ("fit", training.fit, "strategy"),
                    ("prepare_run", training.prepare_run, "strategy"),
                    ("tune_training", tula_ray.tune_training, "strategy"),
                    ("search", tula_ray.search, "training_strategy"))}
    assert defaults == dict.fromkeys(defaults, TRAINING_STRATEGY_DEFAULT)


@pytest.mark.parametrize("n, b, options, expected, note", [
    (2, 1024, {}, {}, None),  # 32 < 512: the sub-batch fits
    (2, 64, {}, {"source": "local"}, "does not fit in the local batch B/N = 32"),
    (4, 64, {"small_batch": 8}, {"small_batch": 8}, None),
    (2, 64, {"source": "local"}, {"source": "local"}, None),
])
def test_ags_checks_its_sub_batch_against_the_local_batch(n, b, options, expected, note):
    checked, notes = TRAINING_STRATEGIES["ags"].check(n, b, options)
    assert checked == expected
    assert (note is None and notes == []) or (len(notes) == 1 and note in notes[0])


@pytest.mark.parametrize("n, b, options, message", [
    (2, 128, {"small_batch": 64},
     "from 64 samples of each worker's local batch of 64 .* small_batch < 64 or source"),
    (2, 64, {"small_batch": 32}, r"small_batch < 32 or source='local' \(b = 32\)"),
    (1, 64, {"source": "local"}, "needs >= 2 workers"),
    (2, 64, {"warmup_epochs": 1}, "option 'warmup_epochs' is unknown for strategy 'ags'"),
])
def test_ags_refuses_what_cannot_run_before_any_worker(n, b, options, message):
    with pytest.raises(ValueError, match=message):
        TRAINING_STRATEGIES["ags"].check(n, b, options)


def test_polo_notes_that_one_worker_has_nothing_to_average():
    assert TRAINING_STRATEGIES["polo"].check(2, 64, {}) == ({}, [])
    options, notes = TRAINING_STRATEGIES["polo"].check(1, 64, {"switch_epoch": 2})
    assert options == {"switch_epoch": 2} and "N=1 is plain steps" in notes[0]


class _AdamStrategy(BaseStrategy):
    """A user's fifth strategy: Adam at a fixed LR, with one option."""

    name, options = "adam-user", ("lr_scale",)

    def build(self, model, *, global_batch, steps_per_epoch, epochs, lr, momentum, weight_decay,
              options):
        scale = options.get("lr_scale", 0.1)
        return StrategySetup(self.name, torch.optim.Adam(model.parameters(), lr=lr * scale))


def test_a_user_registers_a_fifth_strategy_and_fit_trains_with_it():
    from tula_ray.training.run import fit

    workload = get_workload("fashion-mnist-cnn", data="fake", fake_size=64)
    register_training_strategy(_AdamStrategy())
    try:
        assert get_training_strategy("adam-user").name == "adam-user"
        frame = fit(workload, global_batch=32, strategy="adam-user", epochs=1,
                    options={"lr_scale": 0.5})
        assert frame["strategy"].tolist() == ["adam-user"] and frame["lr"].tolist() == [0.005]
        # Its build predates optimizer_fn: it builds its own optimizer, and says so.
        assert any("builds its own optimizer" in note for note in frame.attrs["notes"])
        with pytest.raises(ValueError, match="option 'delta' is unknown for strategy 'adam-user'"):
            fit(workload, global_batch=32, strategy="adam-user", epochs=1, options={"delta": 1})
    finally:
        unregister_training_strategy("adam-user")
    assert "adam-user" not in TRAINING_STRATEGIES
    # The object itself works without registration (how it reaches Ray workers).
    assert fit(workload, global_batch=32, strategy=_AdamStrategy(), epochs=1)["lr"].tolist() \
        == [0.001]


# --------------------------------------------------------------------------- the user's optimizer

def _adam(params):
    """A user's optimizer: Adam, with a second param group at a tenth of the LR."""
    params = list(params)
    return torch.optim.Adam([{"params": params[:1], "lr": 1e-4}, {"params": params[1:]}],
                            lr=1e-3)


@pytest.mark.parametrize("name", ["ags", "ags-ns", "lbt", "lrs", "polo"])
def test_every_strategy_but_lars_trains_the_workloads_own_optimizer(name):
    """Issue 41, item 1: the workload's Adam, wrapped (AGS, AGS-NS: TulaOptimizer) or
    scaled (LRS: every group x B / 128), never replaced by an SGD."""
    from tula_ray.training.strategy_base import describe_optimizer

    setup = _build(name, global_batch=256, optimizer_fn=_adam)
    inner = base_optimizer(setup.optimizer)
    assert type(inner) is torch.optim.Adam
    scale = 256 / BASE_BATCH_DEFAULT if name == "lrs" else 1.0
    lrs = [group["lr"] for group in inner.param_groups]
    if setup.scheduler is not None:  # the warm-up starts below the target; its target:
        lrs = setup.scheduler.base_lrs
    assert lrs == pytest.approx([1e-4 * scale, 1e-3 * scale])
    wrapped = {"ags": "TulaOptimizer(Adam)", "ags-ns": "TulaOptimizer(Adam)"}
    assert describe_optimizer(setup.optimizer) == wrapped.get(name, "Adam")


def test_a_given_lr_moves_the_workloads_optimizer_keeping_its_groups_ratios():
    """A tuned or given base LR replaces the optimizer's own; a group at a tenth stays so."""
    inner = base_optimizer(_build("ags-ns", global_batch=256, optimizer_fn=_adam,
                                  lr=0.004).optimizer)
    assert type(inner) is torch.optim.Adam
    assert [g["lr"] for g in inner.param_groups] == pytest.approx([4e-4, 4e-3])


def test_lars_refuses_another_optimizer_naming_both():
    """LARS builds its own optimizer from an SGD's hyper-parameters: an Adam workload is
    refused, naming Adam, what LARS needs and the strategies that take any optimizer."""
    with pytest.raises(ValueError, match=r"'lars'.*torch\.optim\.SGD.*builds Adam.*'ags-ns'"):
        _build("lars", optimizer_fn=_adam)
    sgd = lambda params: torch.optim.SGD(params, lr=0.02, momentum=0.5)  # noqa: E731
    lars = base_optimizer(_build("lars", global_batch=256, optimizer_fn=sgd).optimizer)
    assert lars.defaults["momentum"] == 0.5
    assert lars.defaults["lr"] == pytest.approx(linear_scaled_lr(0.02, 256))


# --------------------------------------------------------------------------- two gloo ranks

def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _polo_steps(model, setup, data: torch.Generator, steps: int) -> list[torch.Tensor]:
    """`steps` training steps on random batches; the flat parameters after each."""
    params = []
    for _ in range(steps):
        inputs = torch.randn(8, 1, 28, 28, generator=data)
        targets = torch.randint(0, 10, (8,), generator=data)
        setup.optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        setup.optimizer.step()
        setup.scheduler.step()
        params.append(_flat(model.module))
    return params


def _two_rank_worker(rank: int, out_dir: str) -> None:
    from tula_ray.training.checkpoints import checkpoint_state, restore_state
    from tula_ray.training.epochs import evaluate, train_epoch
    from tula_ray.training.data import make_loaders

    # PoLo: synchronous for 1 epoch of 4 steps, then local, averaging every 2 steps.
    polo_kwargs = {"global_batch": 16, "steps_per_epoch": 4, "epochs": 3,
                   "options": {"switch_epoch": 1, "averages_per_epoch": 2, "warmup_epochs": 1}}
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(FashionCNN())
    setup = build_strategy("polo", model, **polo_kwargs)
    data = torch.Generator().manual_seed(100 + rank)  # different data per rank
    params = _polo_steps(model, setup, data, 9)
    state = checkpoint_state(model, setup, epoch=1)
    polo = {"params": params, "notes": setup.notes, "comm_iter": setup.comm_state.iter,
            "checkpoint": state}
    # Two more steps straight on, and the same two after a rebuild + restore.
    data_state = data.get_state()
    polo["straight"] = _polo_steps(model, setup, data, 2)
    torch.manual_seed(5)
    model = nn.parallel.DistributedDataParallel(FashionCNN())
    setup = build_strategy("polo", model, **polo_kwargs)
    restore_state(state, model, setup)
    polo["resumed_counters"] = (setup.comm_state.iter, setup.optimizer.averager.step)
    polo["resumed"] = _polo_steps(model, setup, data.set_state(data_state), 2)

    # train_epoch/evaluate over 2 ranks: AGS with the DDP-local gradient as g_small.
    # Random tensors instead of FakeData: spares each rank torchvision's import (seconds).
    data = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(128, 1, 28, 28, generator=data),
                          torch.randint(0, 10, (128,), generator=data))
    test = TensorDataset(torch.randn(32, 1, 28, 28, generator=data),
                         torch.randint(0, 10, (32,), generator=data))
    workload = dataclasses.replace(get_workload("fashion-mnist-cnn", data="fake"),
                                   train_dataset_fn=lambda: train, test_dataset_fn=lambda: test)
    train_loader, test_loader = make_loaders(workload, 16, seed=0, num_replicas=2, rank=rank)
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(FashionCNN())
    setup = build_strategy("ags", model, global_batch=32, steps_per_epoch=len(train_loader),
                           epochs=1, options={"source": "local"})
    metrics = train_epoch(model, setup, nn.CrossEntropyLoss(), train_loader, "cpu", epoch=0)
    metrics.update(evaluate(model, test_loader, "cpu", nn.CrossEntropyLoss()))
    ags = {"metrics": metrics, "params": _flat(model.module),
           "small_batch": setup.optimizer.small_batch, "test_samples": len(test_loader.dataset)}
    torch.save({"polo": polo, "ags": ags}, os.path.join(out_dir, f"{rank}.pt"))


def test_two_gloo_ranks_polo_averages_and_metrics_agree(tmp_path):
    spawn_gloo(_two_rank_worker, 2, str(tmp_path))
    rank0, rank1 = (torch.load(tmp_path / f"{rank}.pt", weights_only=False) for rank in (0, 1))

    polo0, polo1 = rank0["polo"], rank1["polo"]
    assert polo0["notes"] == [] and polo0["comm_iter"] == 4  # the hook went local at step 4
    same = [torch.equal(a, b) for a, b in zip(polo0["params"], polo1["params"])]
    # Steps 0-3 all-reduce gradients; from step 4 on, local steps, the models averaged
    # right after steps 4, 6, 8 (period 2) and apart after the local steps 5 and 7.
    assert same == [True] * 5 + [False, True, False, True]
    assert polo0["checkpoint"]["optimizer"]["step"] == 9  # the averager's counter
    assert polo0["checkpoint"]["comm_iter"] == 4
    # Resumed from the checkpoint, PoLo stays local (step 9) and averages (step 10)
    # exactly as the run that went straight on.
    assert polo0["resumed_counters"] == (4, 9)
    for result in (polo0, polo1):
        assert all(torch.equal(a, b) for a, b in zip(result["straight"], result["resumed"]))
    assert [torch.equal(a, b) for a, b in zip(polo0["resumed"], polo1["resumed"])] == [False, True]

    ags0, ags1 = rank0["ags"], rank1["ags"]
    assert ags0["small_batch"] == 16  # the local batch B / world size
    assert torch.equal(ags0["params"], ags1["params"])
    assert ags0["test_samples"] + ags1["test_samples"] == 32  # each rank half the test set
    for key in ("train_loss", "train_accuracy", "seconds", "scaled_fraction",
                "variability_median", "test_loss", "test_accuracy"):
        assert ags0["metrics"][key] == pytest.approx(ags1["metrics"][key]), key
    assert ags0["metrics"]["steps"] == 4  # 128 samples / (2 ranks x 16)
