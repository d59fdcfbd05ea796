"""TulaOptimizer (Algorithm 1): eq. 5 by hand, bounds, exactness at delta=0, checkpoints, DDP."""

from __future__ import annotations

import copy
import io
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from benchmarks.common import spawn_gloo
from tula_ray.ags import (
    TulaOptimizer,
    backward_with_refresh,
    register_local_gradient_hook,
    gradient_variability,
    max_scale,
    scale_factor,
)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _batches(count: int, size: int = 16, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 6, generator=generator),
             torch.randint(0, 3, (size,), generator=generator)) for _ in range(count)]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, batches, epoch_every: int = 0):
    loss_fn = nn.CrossEntropyLoss()
    for step, (inputs, targets) in enumerate(batches):
        if epoch_every and step % epoch_every == 0 and isinstance(optimizer, TulaOptimizer):
            optimizer.start_epoch()
        optimizer.zero_grad()
        backward_with_refresh(model, optimizer, loss_fn, inputs, targets)
        optimizer.step()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# --------------------------------------------------------------------------- eq. 5 and line 16

def test_gradient_variability_is_eq5():
    assert gradient_variability(8.0, 5.0) == pytest.approx(0.6)
    assert gradient_variability(2.0, 5.0) == pytest.approx(0.6)  # |.|: a drop counts alike
    assert gradient_variability(3.0, None) == math.inf  # first step: sensitive
    assert gradient_variability(3.0, 0.0) == math.inf


def test_step_computes_eq5_on_the_gradient_it_applies():
    weight = nn.Parameter(torch.zeros(2))
    optimizer = TulaOptimizer(torch.optim.SGD([weight], lr=0.1), large_batch=64, small_batch=16)
    for grad in ([1.0, 2.0], [2.0, 2.0], [2.0, 2.1]):  # |G|^2 = 5, 8, 8.41
        weight.grad = torch.tensor(grad)
        optimizer.step()
    assert optimizer.telemetry["variability"] == pytest.approx(0.41 / 8, rel=1e-5)  # float32
    assert optimizer.telemetry["scaled"] and optimizer.telemetry["scaled_steps"] == 1


def test_a_calm_step_applies_the_scales_and_a_sensitive_one_does_not():
    weight = nn.Parameter(torch.zeros(2))
    optimizer = TulaOptimizer(torch.optim.SGD([weight], lr=1.0), large_batch=64, small_batch=16,
                              granularity="element")  # s_max = 2
    weight.grad = torch.tensor([1.0, 1.0])
    optimizer.refresh_scales([torch.tensor([1.5, 4.0])])  # ratios 1.5 and 4 -> capped at 2
    assert weight not in optimizer.scales  # Algorithm 1 line 10: from the next step on
    optimizer.step()  # first step: sensitive, unscaled
    assert torch.allclose(optimizer.scales[weight], torch.tensor([1.5, 2.0]))
    assert torch.allclose(weight.detach(), torch.tensor([-1.0, -1.0]))
    weight.grad = torch.tensor([1.0, 1.1])  # variability 0.105 < 0.5: scaled
    optimizer.step()
    assert torch.allclose(weight.detach(), torch.tensor([-2.5, -3.2]))
    weight.grad = torch.tensor([3.0, 3.0])  # variability 7.1: sensitive again
    optimizer.step()
    assert torch.allclose(weight.detach(), torch.tensor([-5.5, -6.2]))


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, (3, 4), elements=st.floats(-1e3, 1e3, width=32)),
       arrays(np.float32, (3, 4), elements=st.floats(-1e3, 1e3, width=32)),
       st.floats(1.0, 16.0), st.floats(0.0, 1.0), st.sampled_from(["tensor", "element"]))
def test_scales_stay_within_bounds_and_have_the_documented_shape(small, large, s_max, s_min_frac,
                                                                  granularity):
    s_min = s_min_frac * s_max
    scale = scale_factor(torch.from_numpy(small), torch.from_numpy(large), s_max=s_max,
                         s_min=s_min, granularity=granularity)
    assert scale.shape == ((3, 4) if granularity == "element" else ())
    assert torch.all(scale <= s_max) and torch.all(scale >= s_min)
    if granularity == "tensor":
        ratio = np.linalg.norm(small.astype(np.float64)) / (np.linalg.norm(large) + 1e-8)
        assert scale.item() == pytest.approx(min(max(ratio, s_min), s_max), rel=1e-4)
    else:  # line 16 literally, by hand in float64: |g_small / (g_large + eps)|, then bounded
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.abs(small.astype(np.float64) / (large.astype(np.float64) + 1e-8))
        expected = np.clip(np.nan_to_num(ratio, nan=0.0, posinf=np.inf), s_min, s_max)
        np.testing.assert_allclose(scale.numpy(), expected, rtol=1e-4, atol=1e-30)


def test_max_scale_is_line_12():
    assert max_scale(1024, 64) == 4.0


# --------------------------------------------------------------------------- exactness, state

@pytest.mark.parametrize("make_base", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-4),
    lambda params: torch.optim.Adam(params, lr=1e-3),
], ids=["sgd-momentum", "adam"])
def test_delta_zero_updates_equal_the_base_optimizer_exactly(make_base):
    plain, wrapped = _model(), _model()
    batches = _batches(8)
    _train(plain, make_base(plain.parameters()), batches)
    ags = TulaOptimizer(make_base(wrapped.parameters()), large_batch=16, small_batch=4, delta=0.0,
                        refresh_every=2)
    _train(wrapped, ags, batches)
    assert ags.telemetry["refreshes"] == 4 and ags.telemetry["scaled_steps"] == 0
    assert torch.equal(_flat(plain), _flat(wrapped))


def test_scaling_changes_the_trajectory_when_calm():
    plain, wrapped = _model(), _model()
    batches = _batches(8, seed=3)
    _train(plain, torch.optim.SGD(plain.parameters(), lr=0.05), batches)
    ags = TulaOptimizer(torch.optim.SGD(wrapped.parameters(), lr=0.05), large_batch=16,
                        small_batch=4, delta=10.0, refresh_every=2)
    _train(wrapped, ags, batches)
    assert ags.telemetry["scaled_steps"] == 7  # all but the first
    assert not torch.equal(_flat(plain), _flat(wrapped))


@pytest.mark.parametrize("granularity", ["tensor", "element"])
def test_resuming_from_a_checkpoint_continues_identically(granularity):
    batches = _batches(12, seed=5)

    def make(model):
        return TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                             large_batch=16, small_batch=4, delta=0.8, granularity=granularity)

    straight = _model()
    _train(straight, make(straight), batches, epoch_every=4)

    first = _model()
    optimizer = make(first)
    _train(first, optimizer, batches[:6], epoch_every=4)
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = _model(seed=99)  # different init: everything must come from the checkpoint
    resumed.load_state_dict(saved["model"])
    optimizer = make(resumed)
    optimizer.load_state_dict(saved["optimizer"])
    # The epoch boundary at step 8 must fall at the same place: steps 6, 7 are mid-epoch.
    _train(resumed, optimizer, batches[6:8])
    optimizer.start_epoch()
    _train(resumed, optimizer, batches[8:])
    assert torch.equal(_flat(straight), _flat(resumed))


def test_lr_schedulers_drive_the_wrapped_optimizer_and_survive_a_reload():
    model = _model()
    optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), large_batch=16,
                              small_batch=4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _train(model, optimizer, _batches(1))
    scheduler.step()
    assert optimizer.base.param_groups[0]["lr"] == pytest.approx(0.05)
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    scheduler.step()
    assert optimizer.base.param_groups[0]["lr"] == pytest.approx(0.025)
    assert optimizer.param_groups is optimizer.base.param_groups


def test_it_is_a_torch_optimizer_hooks_groups_and_state_work_as_on_any_other():
    model = _model()
    optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                              large_batch=16, small_batch=4, delta=0.3)
    calls = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    _train(model, optimizer, _batches(2))
    assert calls == ["pre", "post", "pre", "post"]
    # Hyper-parameters of both in the one list of groups; scales per parameter in state.
    group = optimizer.param_groups[0]
    assert optimizer.param_groups is optimizer.base.param_groups
    assert (group["lr"], group["momentum"], group["delta"], group["s_max"]) == (0.1, 0.9, 0.3, 2.0)
    assert set(optimizer.state) == set(model.parameters())
    assert all(state["scale"].shape == () for state in optimizer.state.values())
    assert all("momentum_buffer" in optimizer.base.state[p] for p in model.parameters())
    # A group added later reaches the base optimizer, with AGS's defaults.
    extra = nn.Parameter(torch.zeros(3))
    optimizer.add_param_group({"params": [extra], "lr": 0.5})
    assert optimizer.base.param_groups[-1]["params"] == [extra]
    assert optimizer.param_groups[-1]["delta"] == 0.3 and optimizer.param_groups[-1]["momentum"] == 0.9
    with pytest.raises(ValueError, match="delta=-2"):
        optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(1))], "delta": -2})


def test_a_scheduler_drives_delta_and_swalr_drives_the_lr():
    model = _model()
    optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), large_batch=16,
                              small_batch=4, delta=10.0)
    swa = torch.optim.swa_utils.SWALR(optimizer, swa_lr=0.05, anneal_epochs=1)
    _train(model, optimizer, _batches(3))  # 10 > every variability: steps 1, 2 scaled
    assert optimizer.telemetry["scaled_steps"] == 2
    swa.step()
    assert optimizer.base.param_groups[0]["lr"] == pytest.approx(0.05)
    for group in optimizer.param_groups:  # the gate off by the group's hyper-parameter
        group["delta"] = 0.0
    _train(model, optimizer, _batches(3, seed=4))
    assert optimizer.telemetry["scaled_steps"] == 2


def test_state_dict_round_trips_with_adam_and_refuses_the_old_format():
    batches = _batches(10, seed=6)

    def make(model):
        return TulaOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), large_batch=16,
                             small_batch=4, delta=0.8, refresh_every=3)

    straight = _model()
    _train(straight, make(straight), batches)
    first = _model()
    optimizer = make(first)
    _train(first, optimizer, batches[:5])
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    assert set(saved["optimizer"]) == {"state", "param_groups", "base_state", "ags"}
    resumed = _model(seed=99)
    resumed.load_state_dict(saved["model"])
    optimizer = make(resumed)
    optimizer.load_state_dict(saved["optimizer"])
    assert optimizer.param_groups is optimizer.base.param_groups
    _train(resumed, optimizer, batches[5:])
    assert torch.equal(_flat(straight), _flat(resumed))
    with pytest.raises(ValueError, match="format before"):
        optimizer.load_state_dict({"base": {}, "ags": {}})


@pytest.mark.parametrize("kwargs, message", [
    ({"small_batch": 64}, "0 < small_batch < large_batch"),
    ({"delta": -1.0}, "delta=-1.0"),
    ({"refresh_every": "week"}, "refresh_every='week'"),
    ({"refresh_every": 0}, "refresh_every=0"),
    ({"granularity": "layer"}, "granularity='layer'"),
    ({"source": "teacher"}, "source='teacher'"),
    ({"s_max": 0.0}, "s_max=0.0"),
    ({"s_min": 5.0}, "s_min=5.0"),
])
def test_bad_arguments_are_refused_with_the_allowed_values(kwargs, message):
    model = _model()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                      **{"large_batch": 64, "small_batch": 16, **kwargs})


def test_local_source_needs_ddp():
    model = _model()
    optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), large_batch=16,
                              small_batch=8, source="local")
    inputs, targets = _batches(1)[0]
    with pytest.raises(ValueError, match="source='local'.*DistributedDataParallel"):
        backward_with_refresh(model, optimizer, nn.CrossEntropyLoss(), inputs, targets)


# --------------------------------------------------------------------------- two DDP workers

def _ddp_worker(rank: int, out_dir: str) -> None:
    for source in ("sub-batch", "local"):
        model = nn.parallel.DistributedDataParallel(_model())
        optimizer = TulaOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), large_batch=32,
            small_batch=8 if source == "sub-batch" else 16, delta=5.0, refresh_every=3,
            granularity="element", source=source)
        if source == "local":
            register_local_gradient_hook(model, optimizer)
        _train(model, optimizer, _batches(7, seed=10 + rank))  # different data per rank
        scales = torch.cat([s.reshape(-1) for s in optimizer.scales.values()])
        torch.save({"params": _flat(model.module), "scales": scales,
                    "telemetry": optimizer.telemetry},
                   os.path.join(out_dir, f"{source}-{rank}.pt"))


def test_two_ddp_workers_stay_bit_identical_with_both_small_batch_sources(tmp_path):
    spawn_gloo(_ddp_worker, 2, str(tmp_path))
    for source in ("sub-batch", "local"):
        rank0, rank1 = (torch.load(tmp_path / f"{source}-{rank}.pt") for rank in (0, 1))
        assert rank0["telemetry"]["refreshes"] == 3  # steps 0, 3, 6
        assert rank0["telemetry"]["scaled_steps"] >= 1
        assert torch.equal(rank0["scales"], rank1["scales"]), source
        assert torch.equal(rank0["params"], rank1["params"]), source
        assert not torch.all(rank0["scales"] == 1.0)


# --------------------------------------------------------------------------- Algorithm 1, literally

def _bn_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def _epochs_of_batches(epochs: int, steps: int, size: int, seed: int = 7):
    """`epochs` lists of `steps` (inputs, targets) batches; the labels depend on the inputs."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(steps * size, 6, generator=generator)
    labels = (data[:, :3].sum(dim=1) > 0).long() + (data[:, 3] > 1).long()
    out = []
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator)
        out.append([(data[order[i:i + size]], labels[order[i:i + size]])
                    for i in range(0, len(data), size)])
    return out


def reference_algorithm_1(model, epochs, *, lr, momentum, small_batch, delta, refresh_every,
                          granularity, eps=1e-8):
    """Algorithm 1 exactly as the paper prints it, written plainly and independently.

    Line 9's update is torch's SGD (momentum, as in the paper's experiments). The
    small-batch gradient of line 14 is taken at w^(i), before line 9 moves the weights,
    on the first `small_batch` samples of the batch, with BatchNorm in training mode but
    its running statistics untouched (a functional call on copies of the buffers); the
    scales it gives (line 10) act from the NEXT iteration. Returns, per iteration, the
    flat weights after it, whether it was scaled, and the BatchNorm running mean.
    """
    loss_fn = nn.CrossEntropyLoss()
    params = list(model.parameters())
    sgd = torch.optim.SGD(params, lr=lr, momentum=momentum)
    gradscale = [torch.tensor(1.0) for _ in params]  # Input: gradscale <- 1
    previous_norm_sq = None
    iteration = 0
    trace = []
    for batches in epochs:  # line 1
        for index, (inputs, targets) in enumerate(batches):  # line 2
            large = len(inputs)
            refresh = index == 0 if refresh_every == "epoch" else iteration % refresh_every == 0
            sgd.zero_grad()
            loss_fn(model(inputs), targets).backward()  # line 3
            g_large = [p.grad.clone() for p in params]
            norm_sq = sum(float((g.double() ** 2).sum()) for g in g_large)
            if previous_norm_sq is None:  # eq. 5 has no G^(i-1) at the first iteration
                variability = math.inf
            else:
                variability = abs((norm_sq - previous_norm_sq) / previous_norm_sq)  # line 4
            previous_norm_sq = norm_sq
            new_scale = None
            if refresh:  # UPDATEGRADSCALE, lines 12-17, at w^(i)
                s_max = math.sqrt(large / small_batch)  # line 12
                buffers = {name: b.clone() for name, b in model.named_buffers()}
                weights = dict(model.named_parameters())
                outputs = torch.func.functional_call(model, (weights, buffers),
                                                     (inputs[:small_batch],))  # line 13
                g_small = torch.autograd.grad(loss_fn(outputs, targets[:small_batch]), params)
                new_scale = []
                for gs, gl in zip(g_small, g_large):  # line 15
                    if granularity == "element":
                        ratio = (gs / (gl + eps)).abs()
                    else:  # per tensor: the ratio of the norms
                        ratio = torch.linalg.vector_norm(gs) / (torch.linalg.vector_norm(gl) + eps)
                    new_scale.append(torch.clamp(ratio, max=s_max))  # line 16
            scaled = variability < delta  # line 5
            if scaled:
                for p, s in zip(params, gradscale):
                    p.grad.mul_(s)  # line 6
            sgd.step()  # line 9
            if new_scale is not None:
                gradscale = new_scale  # line 10: from the next iteration on
            iteration += 1
            trace.append((_flat(model).clone(), scaled, model[1].running_mean.clone()))
    return trace


@pytest.mark.parametrize("granularity", ["tensor", "element"])
@pytest.mark.parametrize("refresh_every", ["epoch", 3])
def test_the_optimizer_is_algorithm_1_step_for_step(granularity, refresh_every):
    epochs = _epochs_of_batches(epochs=4, steps=4, size=16)
    settings = dict(small_batch=4, delta=0.5, refresh_every=refresh_every,
                    granularity=granularity)
    reference = reference_algorithm_1(_bn_model(), epochs, lr=0.1, momentum=0.9, **settings)

    model = _bn_model()
    optimizer = TulaOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                              large_batch=16, **settings)
    loss_fn = nn.CrossEntropyLoss()
    for epoch, batches in enumerate(epochs):
        optimizer.start_epoch()
        for inputs, targets in batches:
            optimizer.zero_grad()
            backward_with_refresh(model, optimizer, loss_fn, inputs, targets)
            optimizer.step()
            weights, scaled, running_mean = reference[optimizer.telemetry["steps"] - 1]
            step = optimizer.telemetry["steps"] - 1
            assert optimizer.telemetry["scaled"] == scaled, f"gate differs at step {step}"
            torch.testing.assert_close(_flat(model), weights, rtol=1e-6, atol=1e-7,
                                       msg=f"weights differ after step {step}")
            torch.testing.assert_close(model[1].running_mean, running_mean, rtol=1e-6,
                                       atol=1e-7, msg=f"BatchNorm stats differ at step {step}")
    decisions = [scaled for _, scaled, _ in reference]
    # The test means something only if both branches and several refreshes happened.
    assert any(decisions) and not all(decisions)
    assert optimizer.telemetry["refreshes"] == (4 if refresh_every == "epoch" else 6)
