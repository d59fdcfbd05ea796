import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from tula_ray import memory


def test_linear_peaks_are_fitted_exactly():
    b = np.array([8, 16, 64])
    params = memory.fit(b, 1e8 + 2e6 + 1e6 * b, static_bytes=1e8, batch_bytes_per_sample=3136)
    assert params.overhead_bytes == pytest.approx(2e6)
    assert params.bytes_per_sample == pytest.approx(1e6)
    assert params.batch_bytes_per_sample == 3136
    np.testing.assert_allclose(memory.predict_peak_bytes(params, b), 1e8 + 2e6 + 1e6 * b)


def test_max_local_batch_is_exact_on_linear_data():
    params = memory.MemoryParams(1e8, 0.0, 1e6, 0.0)
    assert memory.max_local_batch(params, 2e8, headroom=0.0) == 100
    assert memory.max_local_batch(params, 2e8, headroom=0.1) == 80
    assert memory.max_local_batch(params, 1e8 + 5e5, headroom=0.0) == 0  # not even b = 1


@given(st.floats(0, 1e10), st.floats(-1e8, 1e8), st.floats(1e3, 1e8), st.floats(1e9, 1e11),
       st.floats(0, 0.9))
def test_headroom_is_respected(static, overhead, per_sample, device, headroom):
    params = memory.MemoryParams(static, overhead, per_sample, 0.0)
    b = memory.max_local_batch(params, device, headroom)
    budget = device * (1 - headroom)
    assert b >= 0
    if b > 0:
        assert memory.predict_peak_bytes(params, b) <= budget
    assert memory.predict_peak_bytes(params, b + 1) > budget


@pytest.mark.parametrize("call, message", [
    (lambda: memory.fit([8, 8], [1e6, 2e6]), "at >= 2 distinct local batch sizes"),
    (lambda: memory.fit([8, 16], [1e6, -1]), "positive and finite"),
    (lambda: memory.max_local_batch(memory.MemoryParams(0, 0, 1, 0), 1e9, 1.0), "headroom=1.0"),
    (lambda: memory.max_local_batch(memory.MemoryParams(0, 0, 1, 0), 0), "device_bytes=0"),
    (lambda: memory.max_local_batch(memory.MemoryParams(0, 0, 0, 0), 1e9), "give max_batch"),
])
def test_bad_inputs_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def small_model():
    return torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))


PARAM_BYTES = (10 * 20 + 20 + 20 * 3 + 3) * 4


@pytest.mark.parametrize("factory, optimizer_bytes", [
    (lambda p: torch.optim.SGD(p, lr=0.1), 0),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), PARAM_BYTES),
])
def test_static_memory_of_sgd(factory, optimizer_bytes):
    model = small_model()
    static = memory.static_memory(model, factory)
    assert static.param_bytes == static.grad_bytes == PARAM_BYTES
    assert static.optimizer_bytes == optimizer_bytes
    assert all(p.grad is None for p in model.parameters())  # the model is left alone


def test_static_memory_of_adam_holds_two_moments():
    static = memory.static_memory(small_model(), lambda p: torch.optim.Adam(p))
    assert 2 * PARAM_BYTES <= static.optimizer_bytes <= 2 * PARAM_BYTES + 4 * 64
    assert static.total_bytes == 2 * PARAM_BYTES + static.optimizer_bytes


def test_params_round_trip():
    params = memory.MemoryParams(1.5e8, -2.0, 1e6, 3136.0)
    assert memory.MemoryParams.from_dict(params.to_dict()) == params
