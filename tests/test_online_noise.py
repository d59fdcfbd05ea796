"""The gradient noise scale measured while training (issue 43, item 2), without Ray: the
averages' timescale in samples and bias correction, the pairs every strategy's steps give
(two gloo workers: each worker's gradient and the all-reduced one, read by the comm hook
around the strategy's own; one worker: a sub-batch or the batch's first half), held
exactly against pairs computed here from the same batches at lr = 0, and the checkpoint
that carries the averages."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

from benchmarks.common import spawn_gloo
from tula_ray.models.noise_scale import NoiseAverage, signal_and_noise
from tula_ray.training.checkpoints import checkpoint_state, restore_state
from tula_ray.training.epochs import EpochTally
from tula_ray.training.online_noise import NOISE_METRICS, OnlineNoise, captured_comm_hook
from tula_ray.training.strategies import build_strategy

TIMESCALE = 512.0  # samples: short enough that the steps here weigh unequally
FEATURES, CLASSES = 8, 4


# --------------------------------------------------------------------------- the averages

@given(st.floats(1e-3, 1e3), st.floats(1e-3, 1e3), st.integers(1, 64), st.integers(2, 8),
       st.floats(1.0, 1e5))
def test_bias_correction_makes_the_first_estimate_the_first_pair(small, large, b, ratio,
                                                                  timescale):
    average = NoiseAverage(timescale_samples=timescale)
    average.update(small, b, large, b * ratio)
    first = NoiseAverage()  # the running mean of one pair: the pair itself
    first.update(small, b, large, b * ratio)
    assert average.estimate() == pytest.approx(first.estimate(), rel=1e-9, abs=1e-12)


@given(st.lists(st.floats(0.1, 10.0), min_size=2, max_size=12), st.integers(8, 256),
       st.floats(16.0, 1e4))
def test_a_pair_weighs_exp_minus_the_samples_since_over_the_timescale(values, batch,
                                                                      timescale):
    average = NoiseAverage(timescale_samples=timescale)
    for value in values:  # each pair's tr(Sigma): (2v - v) / (1/b - 1/2b) = 2 b v
        average.update(2.0 * value, batch, value, 2 * batch)
    ages = [batch * (len(values) - 1 - i) for i in range(len(values))]  # in large batches
    weights = [math.exp(-2 * age / timescale) for age in ages]
    expected = sum(w * v for w, v in zip(weights, values)) / sum(weights)
    assert average.estimate()[1] == pytest.approx(2 * batch * expected, rel=1e-9)


@given(st.lists(st.sampled_from([(8, 16), (16, 32), (64, 256), (128, 256), (256, 512)]),
                min_size=1, max_size=20),
       st.floats(1e-3, 10.0), st.floats(1e-2, 1e3), st.sampled_from([None, 0.9, 2048.0]))
def test_pairs_at_different_batches_average_to_the_true_signal_and_noise(batches, signal,
                                                                         noise, smoothing):
    """An adaptive run changes B (and b) between steps: noiseless pairs at any mixture of
    batches, E|g_b|^2 = |G|^2 + tr(Sigma) / b each, give back |G|^2 and tr(Sigma) exactly
    (averaging the norms with their batches read 4.5x the noise for a half-and-half mix
    of b = 16 and b = 256, as an adaptive run's first switches did)."""
    average = NoiseAverage(**({"decay": smoothing} if smoothing == 0.9 else
                              {"timescale_samples": smoothing}))
    for small, large in batches:
        average.update(signal + noise / small, small, signal + noise / large, large)
    assert average.estimate() == pytest.approx((signal, noise), rel=1e-6)
    assert average.noise_scale == pytest.approx(noise / signal, rel=1e-6)


def test_a_state_saved_with_averaged_norms_resumes_as_the_estimates_it_read():
    """A checkpoint written before the averages held estimates loads as what it read."""
    old = {"decay": None, "small_sqr": 2 * 3.0, "large_sqr": 2 * 2.0, "small_batch": 2 * 16,
           "large_batch": 2 * 32, "weight": 2.0, "steps": 5, "timescale_samples": 512.0}
    average = NoiseAverage()
    average.load_state_dict(old)
    assert average.estimate() == pytest.approx(signal_and_noise(3.0, 16, 2.0, 32))
    assert (average.steps, average.timescale_samples) == (5, 512.0)


def test_the_timescale_counts_samples_not_steps():
    one, two = (NoiseAverage(timescale_samples=TIMESCALE) for _ in range(2))
    one.update(3.0, 16, 2.0, 32)
    two.update(3.0, 32, 2.0, 64)  # one pair, then 64 samples of another pair
    for average, steps in ((one, 2), (two, 1)):
        for _ in range(steps):
            average.update(5.0, 16 * (3 - steps), 4.0, 32 * (3 - steps))
    # The first pair's weight left after 64 samples is the same, in two steps or one.
    first_left = [a.weight - (1 - math.exp(-64 / TIMESCALE)) for a in (one, two)]
    assert first_left[0] == pytest.approx(first_left[1] * (1 - math.exp(-32 / TIMESCALE))
                                          / (1 - math.exp(-64 / TIMESCALE)), rel=1e-9)
    with pytest.raises(ValueError, match="timescale_samples=0"):
        NoiseAverage(timescale_samples=0)
    with pytest.raises(ValueError, match="give one of them"):
        NoiseAverage(decay=0.9, timescale_samples=10.0)


def test_the_average_round_trips_through_its_state():
    average = NoiseAverage(timescale_samples=TIMESCALE)
    average.update(3.0, 16, 2.0, 32)
    copy = NoiseAverage()
    copy.load_state_dict(average.state_dict())
    assert copy == average
    with pytest.raises(ValueError, match="unknown keys"):
        copy.load_state_dict({"decay_per_step": 0.5})


# --------------------------------------------------------------------------- the pairs

def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def _batch(seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs, labelled by their largest of the first CLASSES features: a task with
    a gradient signal at the start (random labels have next to none)."""
    inputs = torch.randn(size, FEATURES, generator=torch.Generator().manual_seed(seed))
    return inputs, inputs[:, :CLASSES].argmax(dim=1)


def _frozen_sgd(params):
    return torch.optim.SGD(params, lr=0.0, momentum=0.9)  # lr = 0: the model never moves


def _squared_gradient(module: nn.Module, inputs, targets) -> torch.Tensor:
    """The flat gradient of `module` on a batch, by autograd.grad (no .grad, no DDP hook)."""
    params = [p for p in module.parameters()]
    loss = nn.functional.cross_entropy(module(inputs), targets)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double()


def _trained(strategy: str, model: nn.Module, batches, *, global_batch: int, options=None,
             steps_per_epoch: int = 100, epochs: int = 1, scaled: bool = False,
             **noise_options):
    """`strategy` built on `model` with its comm hook captured, an estimator attached, and
    `batches` trained through the epoch's step with it. scaled: fp16's loss scaler on
    float32 steps (a scale of 2^10: the gradients scaled and unscaled exactly)."""
    with captured_comm_hook(model) as captured:
        setup = build_strategy(strategy, model, global_batch=global_batch,
                               steps_per_epoch=steps_per_epoch, epochs=epochs,
                               optimizer_fn=_frozen_sgd, options=options)
    if scaled:
        setup.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    noise = OnlineNoise.attach(model, setup, nn.CrossEntropyLoss(), global_batch // world,
                               captured, timescale_samples=TIMESCALE, **noise_options)
    tally = EpochTally(model, setup, nn.CrossEntropyLoss(), "cpu", noise.before_step)
    for inputs, targets in batches:
        tally.step(inputs, targets)
    return setup, noise


def _worker_pairs(rank: int, module: nn.Module, seeds, local_batch: int) -> NoiseAverage:
    """The pairs of two workers, computed here: each one's gradient and their mean."""
    import torch.distributed as dist

    reference = NoiseAverage(timescale_samples=TIMESCALE)
    for seed in seeds:
        local = _squared_gradient(module, *_batch(100 * seed + rank, local_batch))
        mean = local.clone()
        dist.all_reduce(mean)
        small = local.square().sum().reshape(1)
        dist.all_reduce(small)
        reference.update(float(small) / 2, local_batch, float((mean / 2).square().sum()),
                         2 * local_batch)
    return reference


def _ddp_strategies(rank: int, out_dir: str) -> None:
    local_batch, results = 64, {}
    for name, strategy, options in (("ags-ns", "ags-ns", None), ("lrs", "lrs", None),
                                    ("polo", "polo", {"switch_epoch": 1}),
                                    ("lbt, loss-scaled", "lbt", None)):
        model = nn.parallel.DistributedDataParallel(_model())
        seeds = range(3)
        batches = [_batch(100 * seed + rank, local_batch) for seed in seeds]
        reference = _worker_pairs(rank, model.module, seeds, local_batch)
        setup, noise = _trained(strategy, model, batches, global_batch=2 * local_batch,
                                options=options, steps_per_epoch=3, epochs=2,
                                scaled="scaled" in name)
        synced = noise.read()
        for inputs, targets in batches:  # PoLo: now local SGD; the others: 3 more pairs
            noise.before_step(inputs, targets)
            setup.train_step(model, nn.CrossEntropyLoss(), inputs, targets)
        later = noise.read()
        results[name] = {"online": synced, "pairs": noise.average.steps,
                             "reference": reference.estimate(), "later": later,
                             "note": noise.note}
    torch.save(results, os.path.join(out_dir, f"{rank}.pt"))


def test_two_workers_pair_their_own_and_the_reduced_gradient_under_every_hook(tmp_path):
    spawn_gloo(_ddp_strategies, 2, str(tmp_path), timeout_s=60)
    first, second = (torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1))
    for strategy, result in first.items():
        assert repr(result) == repr(second[strategy])  # the same figures (NaN too) on each
        grad_sqr, grad_var = result["reference"]
        online = result["online"]
        assert online["grad_sqr"] == pytest.approx(grad_sqr, rel=1e-4)
        assert online["grad_var"] == pytest.approx(grad_var, rel=1e-4)
        assert online["noise_scale"] == pytest.approx(grad_var / grad_sqr, rel=1e-4)
    assert first["ags-ns"]["pairs"] == first["lrs"]["pairs"] == 6
    assert first["lbt, loss-scaled"]["pairs"] == 6  # fp16's scale taken out of both norms
    # PoLo after its switch: local SGD, no all-reduced gradient, no pair: NaN, said so.
    assert first["polo"]["pairs"] == 3
    assert all(math.isnan(first["polo"]["later"][key]) for key in NOISE_METRICS)
    assert "no pair" in first["polo"]["note"]
    assert all(math.isfinite(first["lrs"]["later"][key]) for key in NOISE_METRICS)


def _one_worker_pairs(seeds, batch: int, small: int) -> NoiseAverage:
    module, reference = _model(), NoiseAverage(timescale_samples=TIMESCALE)
    for seed in seeds:
        inputs, targets = _batch(seed, batch)
        reference.update(float(_squared_gradient(module, inputs[:small], targets[:small])
                               .square().sum()), small,
                         float(_squared_gradient(module, inputs, targets).square().sum()),
                         batch)
    return reference


@pytest.mark.parametrize("scaled", [False, True], ids=["fp32", "loss-scaled"])
@pytest.mark.parametrize("strategy, every, small, seeds", [
    ("lbt", 2, 32, [0, 2, 4]),  # the batch's first half, at steps 0, 2 and 4
    ("ags-ns", 1, 32, [0, 1, 2, 3, 4]),  # AGS-NS's own 32-sample sub-batch, every step
])
def test_one_worker_pairs_a_sub_batch_with_its_batch(strategy, every, small, seeds, scaled,
                                                      monkeypatch):
    from tula_ray.training import online_noise

    monkeypatch.setattr(online_noise, "PENDING_CHUNK_STEPS", 2)  # pairs kept in chunks too
    model, forwards = _model(), []
    model.register_forward_hook(lambda *_: forwards.append(1))
    _, noise = _trained(strategy, model, [_batch(seed, 64) for seed in range(5)],
                        global_batch=64, every_steps=every, scaled=scaled)
    grad_sqr, grad_var = _one_worker_pairs(seeds, 64, small).estimate()
    online = noise.read()
    assert noise.mode == ("halves" if strategy == "lbt" else "sub-batch")
    assert noise.average.steps == len(seeds)
    assert online["grad_sqr"] == pytest.approx(grad_sqr, rel=1e-4)
    assert online["grad_var"] == pytest.approx(grad_var, rel=1e-4)
    # AGS-NS's sub-batch is reused: no forward beyond its own two a step; lbt adds one
    # for each half-batch.
    assert len(forwards) == (5 + len(seeds) if strategy == "lbt" else 10)


def test_a_checkpoint_carries_the_averages_and_a_resumed_run_continues_them():
    batches = [_batch(seed, 64) for seed in range(4)]
    _, whole = _trained("lbt", _model(), batches, global_batch=64, every_steps=1)
    whole.read()
    model = _model()
    setup, first = _trained("lbt", model, batches[:2], global_batch=64, every_steps=1)
    first.read()
    state = checkpoint_state(model, setup, 0, noise=first.state_dict())
    resumed_model = _model()
    with captured_comm_hook(resumed_model) as captured:
        resumed_setup = build_strategy("lbt", resumed_model, global_batch=64,
                                       steps_per_epoch=100, epochs=1, optimizer_fn=_frozen_sgd)
    assert restore_state(state, resumed_model, resumed_setup) == 1
    resumed = OnlineNoise.attach(resumed_model, resumed_setup, nn.CrossEntropyLoss(), 64,
                                 captured, timescale_samples=TIMESCALE, every_steps=1)
    resumed.load_state_dict(state["noise"])
    tally = EpochTally(resumed_model, resumed_setup, nn.CrossEntropyLoss(), "cpu",
                       resumed.before_step)
    for inputs, targets in batches[2:]:
        tally.step(inputs, targets)
    assert resumed.read() == pytest.approx(whole.read(), rel=1e-9)
    assert resumed.average.steps == whole.average.steps == 4
    old = {key: value for key, value in state.items() if key != "noise"}
    assert restore_state(old, resumed_model, resumed_setup) == 1  # before the noise key


def test_every_epoch_and_every_evaluation_report_the_noise_scale():
    from tests.text_workload import TEXT_WORKLOAD  # here: the gloo ranks import this module
    from tula_ray.training.run import fit, prepare_run

    frame = fit(TEXT_WORKLOAD, global_batch=32, epochs=2, target_accuracy=1.0,
                eval_every_samples=64, validation_fraction=0.25)
    for key in NOISE_METRICS:
        assert frame[key].notna().all() and key in frame.attrs["evaluations"]
    assert (frame.attrs["evaluations"]["noise_scale"] > 0).all()
    run = prepare_run(TEXT_WORKLOAD, global_batch=32, strategy="lbt", epochs=1)
    assert run.noise is not None and run.noise.mode == "halves"
