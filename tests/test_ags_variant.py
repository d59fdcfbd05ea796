"""AGS-NS, the variant beyond the paper: gain ratio, exponent, moving averages, gate off,
and the DDP comm hook that reads each worker's local gradient before the all-reduce."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from benchmarks.common import spawn_gloo
from tula_ray.ags import TulaOptimizer, gain_ratio, max_scale, register_local_gradient_hook
from tula_ray.ags.equations import carried_sq_norms
from tula_ray.training.strategies import TRAINING_STRATEGIES, build_strategy


def test_gain_ratio_carries_the_measured_ratio_to_the_reference_batch():
    ratio = torch.tensor(2.0)  # |g_b| / |g_B| = 2: x = 4
    assert gain_ratio(ratio, large_batch=1024, measured_batch=32, reference_batch=32) == 4.0
    # B/b_ref - 1 = 31, B/b - 1 = 1 (b = 512): r = 1 + 3 * 31
    assert gain_ratio(ratio, large_batch=1024, measured_batch=512,
                      reference_batch=32) == pytest.approx(94.0)
    assert max_scale(1024, 32, gain_exponent=1.0) == 32.0 and max_scale(1024, 64) == 4.0


def test_ema_estimator_exponent_one_and_the_gate_off_by_hand():
    weight = nn.Parameter(torch.zeros(2))
    optimizer = TulaOptimizer(torch.optim.SGD([weight], lr=1.0), large_batch=64, small_batch=16,
                              estimator="ema", ema_decay=0.5, gain_exponent=1.0, delta=None,
                              refresh_every=1)
    assert optimizer.param_groups[0]["s_max"] == 4.0  # (64 / 16)^1
    weight.grad = torch.tensor([1.0, 0.0])  # |g_B|^2 = 1
    optimizer.refresh_scales([torch.tensor([0.0, 2.0])])  # |g_b|^2 = 4
    optimizer.step()  # no scale yet: the first refresh acts from the next step
    assert torch.allclose(weight.detach(), torch.tensor([-1.0, 0.0]))
    state = optimizer.state[weight]
    assert state["small_sq_avg"].item() == 4.0 and state["large_sq_avg"].item() == 1.0
    assert state["scale"].item() == pytest.approx(4.0, rel=1e-6)  # r = 4 / 1, p = 1
    weight.grad = torch.tensor([2.0, 0.0])  # |g_B|^2 = 4: eq. 5 says 3, but no gate
    optimizer.refresh_scales([torch.tensor([0.0, 1.0])])  # |g_b|^2 = 1
    optimizer.step()  # scaled by 4 (the gate is off): w = -1 - 4 * 2
    assert torch.allclose(weight.detach(), torch.tensor([-9.0, 0.0]))
    assert optimizer.telemetry["scaled_steps"] == 2
    # averages 0.5 * 4 + 0.5 * 1 = 2.5 and 0.5 * 1 + 0.5 * 4 = 2.5: r = 1
    assert state["small_sq_avg"].item() == 2.5 and state["large_sq_avg"].item() == 2.5
    assert state["scale"].item() == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"estimator": "median"}, "estimator='median' is unknown"),
    ({"estimator": "ema", "granularity": "element"}, "granularity='tensor'"),
    ({"gain_exponent": 0.0}, "gain_exponent=0.0"),
    ({"ema_decay": 1.0}, "ema_decay=1.0"),
    ({"delta": -0.5}, "or None for no gate"),
])
def test_bad_variant_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TulaOptimizer(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), large_batch=64,
                      small_batch=16, **kwargs)


def test_the_local_hook_needs_ddp_on_two_workers():
    model = nn.Linear(3, 2)
    optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), large_batch=16,
                              small_batch=8, source="local")
    with pytest.raises(ValueError, match="DistributedDataParallel model on >= 2 workers"):
        register_local_gradient_hook(model, optimizer)


def test_ags_ns_is_registered_with_its_defaults():
    assert TRAINING_STRATEGIES["ags-ns"].check(2, 1024, {}) == ({"source": "local"}, [])
    assert TRAINING_STRATEGIES["ags-ns"].check(1, 1024, {"gain_exponent": 1.0}) == (
        {"gain_exponent": 1.0, "source": "sub-batch"}, [])


def test_ags_ns_builds_adascale_s_equal_r_capped_at_b_over_32_every_step_without_gate():
    """What a user of strategy="ags-ns" gets with no options: AdaScale's exponent 1 and
    cap B / 32, the per-step moving average, no gate (one worker: the sub-batch source)."""
    model = nn.Linear(4, 3)
    setup = build_strategy("ags-ns", model, global_batch=1024, steps_per_epoch=10, epochs=2,
                           lr=0.01, momentum=0.9, weight_decay=0.0)
    optimizer = setup.optimizer
    group = optimizer.param_groups[0]
    assert (group["gain_exponent"], group["s_max"], group["delta"]) == (1.0, 32.0, None)
    assert (optimizer.estimator, optimizer.refresh_every, optimizer.source,
            optimizer.small_batch) == ("ema", 1, "sub-batch", 32)


@pytest.mark.parametrize("name", ["ags", "ags-ns"])
@pytest.mark.parametrize("n, b", [(1, 32), (2, 32), (1, 16), (4, 32)])
def test_ags_trains_a_batch_no_larger_than_its_reference_with_plain_steps(name, n, b):
    """At B <= the reference small batch (32) the large batch is a small one: the gain is 1.
    The check accepts the (N, B) with a note (a search's plan may choose it: issue 22,
    item 6) and the strategy builds the workload's plain SGD, no TulaOptimizer."""
    options, notes = TRAINING_STRATEGIES[name].check(n, b, {})
    assert options == {} and len(notes) == 1
    assert f"B={b} is not larger than its reference small batch 32" in notes[0]
    model = nn.Linear(4, 2)
    setup = build_strategy(name, model, global_batch=b, steps_per_epoch=3, epochs=1)
    assert type(setup.optimizer) is torch.optim.SGD and setup.name == name
    assert setup.notes == notes
    # Above it, AGS proper; with a smaller reference of the user's, AGS proper at 32 too.
    assert isinstance(build_strategy(name, model, global_batch=64, steps_per_epoch=3,
                                     epochs=1).optimizer, TulaOptimizer)
    assert isinstance(build_strategy(name, model, global_batch=32, steps_per_epoch=3, epochs=1,
                                     options={"small_batch": 8}).optimizer, TulaOptimizer)


# --------------------------------------------------------------------------- two DDP workers

def _hook_worker(rank: int, out_dir: str) -> None:
    import torch.distributed as dist

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    generator = torch.Generator().manual_seed(20 + rank)  # different data per rank
    inputs, targets = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,),
                                                                           generator=generator)
    # By hand: this rank's local gradient, and the mean over ranks (the all-reduced one).
    local = torch.autograd.grad(nn.functional.cross_entropy(plain(inputs), targets),
                                list(plain.parameters()))
    mean = [g.clone() for g in local]
    for g in mean:
        dist.all_reduce(g)
        g.div_(2)
    def scale(ratio):  # B = 16, b = 8, b_ref = 2: r = 1 + (x - 1)(16/2 - 1)/(16/8 - 1), p = 1/2
        r = 1 + (ratio ** 2 - 1) * (16 / 2 - 1) / (16 / 8 - 1)
        return r.clamp(min=0).sqrt().clamp(max=math.sqrt(16 / 2))

    mean_norms = torch.stack([g.norm() for g in mean])
    # "refresh": each rank's scale from its |g_i| / |g_B|, then averaged over the ranks.
    refresh = scale(torch.stack([g.norm() for g in local]) / (mean_norms + 1e-8))
    dist.all_reduce(refresh)
    # "ema" (one step: the averages are the values): sqrt(mean_i |g_i|^2) / |g_B|.
    local_sq = torch.stack([g.norm() ** 2 for g in local])
    dist.all_reduce(local_sq)
    expected = {"refresh": refresh / 2, "ema": scale((local_sq / 2).sqrt() / (mean_norms + 1e-8))}
    results = {"expected": expected}
    for estimator in ("refresh", "ema"):
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)))
        optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), large_batch=16,
                                  small_batch=2, source="local", estimator=estimator,
                                  refresh_every=1)
        register_local_gradient_hook(model, optimizer)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        results[estimator] = {"scales": torch.stack([optimizer.state[p]["scale"]
                                                     for p in model.parameters()]),
                              "grads": grads, "mean": mean,
                              "params": torch.cat([p.detach().reshape(-1)
                                                   for p in model.parameters()])}
    torch.save(results, os.path.join(out_dir, f"{rank}.pt"))


def test_the_comm_hook_sees_local_gradients_and_all_reduces_as_ddp_does(tmp_path):
    spawn_gloo(_hook_worker, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]
    for estimator in ("refresh", "ema"):
        for result in ranks:
            got = result[estimator]
            # The hook's all-reduce gave the mean gradient, as DDP's default does.
            for g, m in zip(got["grads"], got["mean"]):
                torch.testing.assert_close(g, m)
            torch.testing.assert_close(got["scales"], result["expected"][estimator])
        assert torch.equal(ranks[0][estimator]["scales"], ranks[1][estimator]["scales"])
        assert torch.equal(ranks[0][estimator]["params"], ranks[1][estimator]["params"])
        assert (ranks[0][estimator]["scales"] > 1).all()  # b_ref = 2 < b = 8: gains above 1


@settings(max_examples=60, deadline=None)
@given(signal=st.floats(0.0, 10.0), noise=st.floats(0.0, 1000.0),
       batches=st.tuples(*(st.sampled_from([8, 16, 32, 64, 128, 256]) for _ in range(4))))
def test_carried_norms_are_the_noiseless_norms_at_the_new_batches(signal, noise, batches):
    """E|g_b|^2 = |G|^2 + tr(Sigma) / b (McCandlish): from any two batches to any two."""
    measured_from, large_from, measured_to, large_to = batches
    assume(measured_from != large_from)
    expected = lambda b: torch.tensor(signal + noise / b, dtype=torch.float64)  # noqa: E731
    small, large = carried_sq_norms(expected(measured_from), expected(large_from),
                                    measured_from=measured_from, large_from=large_from,
                                    measured_to=measured_to, large_to=large_to)
    assert small.item() == pytest.approx(expected(measured_to).item(), rel=1e-9, abs=1e-9)
    assert large.item() == pytest.approx(expected(large_to).item(), rel=1e-9, abs=1e-9)


def test_carried_norms_of_all_noise_stop_at_zero():
    # |g_16|^2 = 1, |g_32|^2 = 0.25: the line's |G|^2 is -0.5; at B = 256 it reads < 0
    small, large = carried_sq_norms(torch.tensor(1.0), torch.tensor(0.25), measured_from=16,
                                    large_from=32, measured_to=16, large_to=256)
    assert small.item() == pytest.approx(1.0) and large.item() == 0.0
    with pytest.raises(ValueError, match="measured_from=32 equals large_from=32"):
        carried_sq_norms(torch.tensor(1.0), torch.tensor(1.0), measured_from=32,
                         large_from=32, measured_to=16, large_to=64)


def _noiseless_refresh(optimizer: TulaOptimizer, weight: nn.Parameter, signal: float,
                       noise: float) -> None:
    """One refresh and step whose norms are E|g|^2 at the optimizer's batches, exactly."""
    def at(batch: int) -> torch.Tensor:
        return torch.tensor([math.sqrt(signal + noise / batch), 0.0])
    weight.grad = at(optimizer.large_batch)
    optimizer.refresh_scales([at(optimizer.measured_batch)])
    optimizer.step()


def test_a_resize_carries_the_moving_averages_to_the_new_batch():
    """An adaptive batch: after B changes, the averages hold the new batch's norms from its
    first refresh on, not a mixture of the old and new batches' (which would read the
    noise of B = 64 as B = 256's for ~10 steps). Fails on averages kept as they were."""
    weight = nn.Parameter(torch.zeros(2))
    optimizer = TulaOptimizer(torch.optim.SGD([weight], lr=0.0), large_batch=64,
                              small_batch=16, estimator="ema", gain_exponent=1.0, delta=None,
                              refresh_every=1)
    signal, noise = 0.5, 40.0
    for _ in range(5):
        _noiseless_refresh(optimizer, weight, signal, noise)
    optimizer.resize(64, 256)
    _noiseless_refresh(optimizer, weight, signal, noise)
    state = optimizer.state[weight]
    assert state["small_sq_avg"].item() == pytest.approx(signal + noise / 16, rel=1e-5)
    assert state["large_sq_avg"].item() == pytest.approx(signal + noise / 256, rel=1e-5)
    # r = E|g_16|^2 / E|g_256|^2, AdaScale's gain at the new B
    gain = (signal + noise / 16) / (signal + noise / 256)
    assert state["scale"].item() == pytest.approx(gain, rel=1e-5)
    # a checkpoint keeps the batches the averages are at
    restored = TulaOptimizer(torch.optim.SGD([weight], lr=0.0), large_batch=256,
                             small_batch=16, estimator="ema", gain_exponent=1.0, delta=None,
                             refresh_every=1)
    restored.load_state_dict(optimizer.state_dict())
    assert restored._averages_at == (16, 256)
