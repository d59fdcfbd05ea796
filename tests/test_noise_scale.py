"""The gradient noise scale (issue 25, item 1) without Ray: McCandlish et al.'s two-batch
estimator, its averages, the efficiency per batch, and the profiling step that measures it
on one worker (halves of its batch) and on two DDP workers (their own gradients and the
all-reduced one), held against a model whose |G|^2 and tr(Sigma) are known exactly."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn

from benchmarks.common import spawn_gloo
from tula_ray.models.noise_scale import NoiseAverage, efficiency, noise_scale, signal_and_noise
from tula_ray.training.gradient_noise import measure_gradient_noise
from tula_ray.training.strategy_base import StrategySetup

DIM, SIGMA = 20, 0.5  # samples x ~ N(mu, SIGMA^2 I): per-sample gradient w - x
TRUE_VAR = DIM * SIGMA ** 2  # tr(Sigma)


@given(st.floats(0.0, 100.0), st.floats(0.0, 1e4), st.integers(1, 512), st.integers(1, 8))
def test_the_estimator_inverts_the_expected_squared_norms(signal, var, small, ratio):
    large = small * (ratio + 1)
    grad_sqr, grad_var = signal_and_noise(signal + var / small, small, signal + var / large,
                                          large)
    assert grad_sqr == pytest.approx(signal, rel=1e-6, abs=1e-6)
    assert grad_var == pytest.approx(var, rel=1e-6, abs=1e-6)


def test_noise_scale_and_efficiency():
    assert noise_scale(2.0, 64.0) == 32.0 and noise_scale(0.0, 1.0) == math.inf
    assert noise_scale(1.0, -3.0) == 0.0  # a noisy negative variance: no noise
    assert efficiency(100.0, 32, 32) == 1.0  # the reference batch itself
    assert efficiency(100.0, 1024, 32) == pytest.approx(132 / 1124)
    assert efficiency(0.0, 1024, 32) == pytest.approx(1 / 32)  # no noise: samples wasted
    assert efficiency(math.inf, 1024, 32) == 1.0  # all noise: perfect scaling
    with pytest.raises(ValueError, match="small_batch=8, large_batch=8"):
        signal_and_noise(1.0, 8, 1.0, 8)


def test_averages_mean_or_move_with_bias_correction():
    running = NoiseAverage()
    for small, large in ((3.0, 2.0), (5.0, 4.0)):
        running.update(small, 1, large, 2)
    assert running.steps == 2  # the mean of the pairs' estimates: the means' estimate
    assert running.estimate() == pytest.approx(signal_and_noise(4.0, 1, 3.0, 2))
    moving = NoiseAverage(decay=0.9)
    moving.update(3.0, 1, 2.0, 2)  # bias-corrected: one step is its own value
    assert moving.estimate() == pytest.approx(signal_and_noise(3.0, 1, 2.0, 2))
    moving.update(math.inf, 1, 2.0, 2)  # an overflowed fp16 step is left out
    assert moving.steps == 1
    assert math.isnan(NoiseAverage().noise_scale)
    with pytest.raises(ValueError, match="decay=1.5"):
        NoiseAverage(decay=1.5)


class Mean(nn.Module):
    """The mean estimation problem: loss 0.5 |w - x|^2 per sample, gradient w - x, so
    |G|^2 = |w - mu|^2 and tr(Sigma) = DIM SIGMA^2 exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w - x


def _half_squared(residual: torch.Tensor, _targets: torch.Tensor) -> torch.Tensor:
    return 0.5 * residual.square().sum(dim=1).mean()


def _batches(seed: int, size: int):
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield (SIGMA * torch.randn(size, DIM, generator=generator), torch.zeros(size))


def test_one_worker_measures_the_known_noise_from_halves_of_its_batch():
    model = Mean()  # mu = 0: |G|^2 = |w|^2 = DIM
    average = measure_gradient_noise(model, StrategySetup("plain", torch.optim.SGD(
        model.parameters(), lr=0.1)), _half_squared, _batches(0, 64), steps=400)
    grad_sqr, grad_var = average.estimate()
    assert average.steps == 400 and model.w.grad is None  # cleared; the weights unmoved
    assert grad_sqr == pytest.approx(DIM, rel=0.05)
    assert grad_var == pytest.approx(TRUE_VAR, rel=0.15)
    assert torch.equal(model.w.detach(), torch.ones(DIM))


def _ddp_worker(rank: int, out_dir: str) -> None:
    model = nn.parallel.DistributedDataParallel(Mean())
    setup = StrategySetup("plain", torch.optim.SGD(model.parameters(), lr=0.1))
    average = measure_gradient_noise(model, setup, _half_squared, _batches(rank, 32),
                                     steps=400, world_size=2, no_sync=model.no_sync)
    torch.save({"estimate": average.estimate(), "steps": average.steps},
               os.path.join(out_dir, f"{rank}.pt"))


def test_two_ddp_workers_measure_it_from_their_own_and_the_reduced_gradient(tmp_path):
    spawn_gloo(_ddp_worker, 2, str(tmp_path))
    first, second = (torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1))
    assert first == second  # one all-reduce per step: every worker has the same figures
    grad_sqr, grad_var = first["estimate"]
    assert grad_sqr == pytest.approx(DIM, rel=0.05)
    assert grad_var == pytest.approx(TRUE_VAR, rel=0.15)


def _mean_workload(samples: int = 4096):
    """A user's Workload for the mean estimation problem: |G|^2 = DIM, tr(Sigma) = TRUE_VAR
    at the fresh weights, so phi = TRUE_VAR / DIM = SIGMA^2."""
    from torch.utils.data import TensorDataset

    from tula_ray import Workload

    inputs = SIGMA * torch.randn(samples, DIM, generator=torch.Generator().manual_seed(3))
    return Workload(name="mean-estimation", model_fn=Mean,
                    train_dataset_fn=lambda: TensorDataset(inputs, torch.zeros(samples)),
                    loss_fn=lambda: _half_squared)


def test_measure_noise_scale_finds_a_users_models_known_phi_at_its_weights():
    """`tula_ray.measure_noise_scale` at the fresh weights (|w - mu|^2 = DIM) and at weights
    moved halfway to the mean (a quarter of the signal, phi four times larger), given as a
    state_dict; the model's weights and mode are left as they were."""
    import tula_ray

    workload = _mean_workload()
    fresh = tula_ray.measure_noise_scale(workload, pairs=200, batch=64)
    assert fresh == pytest.approx(SIGMA ** 2, rel=0.2)
    model = Mean().eval()
    trained = {"w": torch.full((DIM,), 0.5)}
    moved = tula_ray.measure_noise_scale(workload, model, state_dict=trained, pairs=200,
                                         batch=64)
    assert moved == pytest.approx(4 * SIGMA ** 2, rel=0.2)
    assert torch.equal(model.w.detach(), trained["w"]) and not model.training


def test_measure_noise_scale_averages_over_a_continuation_and_leaves_the_model_alone():
    """steps > 0: a copy trains on toward the mean (the signal |w - mu|^2 shrinks), the
    pairs spread along it, so the pooled phi exceeds the start's; the model is untouched."""
    import tula_ray

    workload = _mean_workload()
    model = Mean()
    start = tula_ray.measure_noise_scale(workload, model, pairs=100, batch=64)
    along = tula_ray.measure_noise_scale(workload, model, pairs=100, batch=64, steps=60,
                                         train_batch=32)
    assert along > 1.5 * start
    assert torch.equal(model.w.detach(), torch.ones(DIM)) and model.training


@pytest.mark.parametrize("kwargs, message", [({"pairs": 0}, "pairs=0"),
                                             ({"steps": -1}, "steps=-1"),
                                             ({"steps": 5, "train_batch": 8192},
                                              "train_batch=8192 exceeds"),
                                             ({"batch": 1}, "batch=1"),
                                             ({"batch": 8192}, "batch=8192 exceeds")])
def test_measure_noise_scale_refuses_bad_arguments_by_name(kwargs, message):
    import tula_ray

    with pytest.raises(ValueError, match=message):
        tula_ray.measure_noise_scale(_mean_workload(), **kwargs)
