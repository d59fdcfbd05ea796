import numpy as np
import pytest
import torch
from hypothesis import example, given, strategies as st

from tula_ray.failures import UserCodeError
from tula_ray.models import batch_limit, memory


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


# --- the bound check (memory.verified_max_local_batch) ------------------------------------

def _kinked(step_peak: float, base: float, slope: float):
    """Peak of a model whose optimizer-step peak dominates small b and activations large b
    (resnet18 on CPU here): a small-b probe sees the flat part only."""
    calls = []

    def peak(b: int) -> float:
        calls.append(b)
        return max(step_peak, base + slope * b) + 0.1 * slope * b
    return peak, calls


def _probe_fit(peak, batches=(16, 32, 64)):
    measured = [(b, peak(b)) for b in batches]
    return memory.fit(*zip(*measured)), measured


@given(st.floats(1.7, 3.0), st.floats(1e5, 1e6), st.floats(0.0, 0.3))  # kink above b = 64
@example(1.9, 100000.00000000001, 0.0)  # a secant exactly on the limit, over it by rounding
def test_the_check_pulls_an_overshooting_bound_under_the_device(step_factor, slope, headroom):
    base = 1e8
    peak, calls = _kinked(base * step_factor, base, slope)
    params, measured = _probe_fit(peak)
    device = base * step_factor * 4
    limit = device * (1 - headroom)
    true_bound = next(b for b in range(1, 10**6) if peak(b + 1) > limit)
    assert memory.max_local_batch(params, device, headroom) > true_bound  # unchecked: overshoots
    bound, checks = memory.verified_max_local_batch(params, peak, device, headroom=headroom,
                                                    measured=measured)
    assert checks and len(checks) <= memory.MAX_BOUND_CHECKS_DEFAULT
    assert peak(bound) <= limit  # the bound was measured to fit
    assert bound >= 0.9 * true_bound  # and is not needlessly low (secant on a line: exact)


def test_an_exact_model_costs_one_check():
    peak, calls = _kinked(0.0, 1e8, 1e6)
    params, measured = memory.MemoryParams(1e8, 0.0, 1.1e6, 0.0), [(16, peak(16)), (64, peak(64))]
    bound, checks = memory.verified_max_local_batch(params, peak, 2.1e8, headroom=0.0,
                                                    measured=measured)
    assert bound == memory.max_local_batch(params, 2.1e8, headroom=0.0) == 100
    assert checks == [(100, peak(100))]


def test_nothing_above_the_cap_is_measured():
    peak, calls = _kinked(0.0, 1e8, 1e6)
    params, measured = memory.MemoryParams(1e8, 0.0, 1.1e6, 0.0), [(16, peak(16)), (64, peak(64))]
    calls.clear()
    bound, checks = memory.verified_max_local_batch(params, peak, 2.1e8, headroom=0.0,
                                                    measured=measured, cap=80)
    assert (bound, calls) == (80, [80])
    bound, checks = memory.verified_max_local_batch(params, peak, 2.1e8, headroom=0.0,
                                                    measured=measured, cap=50)
    assert (bound, checks) == (50, [])  # the probe already measured more than the cap


def test_an_out_of_memory_check_halves_toward_what_fits():
    def peak(b):  # the device fails above b = 70, below where the model puts its bound
        return None if b > 70 else 1e8 + 1e6 * b
    params = memory.MemoryParams(1e8, 0.0, 1e6, 0.0)
    bound, checks = memory.verified_max_local_batch(params, peak, 2e8, headroom=0.0,
                                                    measured=[(16, peak(16)), (64, peak(64))])
    assert checks[0] == (100, None)
    assert bound <= 70 and all(p is None for b, p in checks if b > 70)


# --- the model's own limit (batch_limit.checked_max_local_batch, issue 41 item 4) ---------

CANDIDATE_LOCAL_BATCHES = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]  # B 32..4096, N 1, 2


def _asserts_at_most(most: int, out_of_memory_above: int | None = None):
    """A fake probe step: linear peaks; the model's forward refuses batches above `most`."""
    calls = []

    def peak(b: int) -> float | None:
        calls.append(b)
        if b > most:
            raise UserCodeError(f"workload 'mine': memory probe at local batch {b} raised "
                                f"AssertionError: batch {b} > {most}")
        if out_of_memory_above is not None and b > out_of_memory_above:
            return None
        return 1e8 + 1e6 * b
    return peak, calls


def _search_with_limit(peak, device=1e12, measured=(16, 32, 64), refused=None):
    params = memory.MemoryParams(1e8, 0.0, 1e6, 0.0)
    return batch_limit.checked_max_local_batch(
        params, peak, device, headroom=0.0, local_batches=CANDIDATE_LOCAL_BATCHES,
        measured=[(b, 1e8 + 1e6 * b) for b in measured], refused=refused)


def test_a_model_limit_is_a_bound_found_among_the_candidates():
    """A forward asserting b <= 256 on a device with room for far more: the cap (4096) is
    refused, then the candidates between 64 and 4096 are bisected, 2 more steps."""
    peak, calls = _asserts_at_most(256)
    bound, checks, limit = _search_with_limit(peak)
    assert bound == 256 and calls == [4096, 512, 256]
    assert checks == [(256, 1e8 + 256e6)]  # a refused batch has no peak to list
    assert limit.local_batch == 512 and "batch 512 > 256" in limit.error
    assert limit.reason().startswith("above the model's own batch limit (b=512): workload")
    warning = limit.warning(bound, smallest_workers=1)
    assert "max_batch=256" in warning and "memory probe at local batch 512" in warning
    assert batch_limit.BatchLimit.from_dict(limit.to_dict()) == limit


def test_without_a_refusal_the_memory_check_is_as_it_was():
    peak, calls = _asserts_at_most(10**6)
    params = memory.MemoryParams(1e8, 0.0, 1e6, 0.0)
    measured = [(b, 1e8 + 1e6 * b) for b in (16, 32, 64)]
    bound, checks, limit = batch_limit.checked_max_local_batch(
        params, peak, 2e8, headroom=0.0, local_batches=CANDIDATE_LOCAL_BATCHES,
        measured=measured)
    assert limit is None
    assert (bound, checks) == memory.verified_max_local_batch(params, peak, 2e8, headroom=0.0,
                                                              measured=measured, cap=4096)


def test_memory_below_the_model_limit_still_bounds():
    """Out of memory above 128, the model refusing above 1024: memory binds."""
    peak, _ = _asserts_at_most(1024, out_of_memory_above=128)
    bound, _, limit = _search_with_limit(peak)
    assert bound == 128 and limit.local_batch == 4096


def test_a_limit_the_probe_found_skips_the_secant_search():
    """The probe's third batch (64) refused: bisect below it at once, nothing above."""
    peak, calls = _asserts_at_most(40)
    bound, checks, limit = _search_with_limit(
        peak, measured=(16, 32), refused={64: "workload 'mine': ... batch 64 > 40"})
    assert (bound, checks, calls) == (32, [], [])
    assert limit.local_batch == 64


# --- the device budget: what the probe cannot see (issue 14, GPU review item 5) ------------

GB = 1e9


def test_budget_of_one_worker_is_the_free_device():
    # N = 1 has no DDP buckets and no NCCL: only what is already in use comes off.
    assert memory.device_budget_bytes(32 * GB, grad_bytes=0.1 * GB, num_workers=1,
                                      in_use_bytes=0.5 * GB, nccl=True) == pytest.approx(31.5 * GB)


def test_budget_of_data_parallel_workers_pays_buckets_and_nccl_buffers():
    # 32 GB V100: 0.5 GB CUDA context, resnet50's 0.1 GB of gradients copied into DDP's
    # buckets, NCCL's 128 MiB of ring buffers (2 sides x 16 channels x 4 MiB).
    nccl = 2 * 16 * 4 * 2**20
    assert memory.device_budget_bytes(32 * GB, grad_bytes=0.1 * GB, num_workers=2,
                                      in_use_bytes=0.5 * GB, nccl=True) \
        == pytest.approx(32 * GB - 0.5 * GB - 0.1 * GB - nccl)
    # gloo (CPU): the buckets still exist, NCCL's buffers do not.
    assert memory.device_budget_bytes(4 * GB, grad_bytes=0.25 * GB, num_workers=4) \
        == pytest.approx(3.75 * GB)


def test_the_budget_lowers_the_bound_by_the_missing_bytes():
    # 1 MB per sample: every MB the budget loses is one sample less of local batch.
    params = memory.MemoryParams(1e8, 0.0, 1e6, 0.0)
    full = memory.max_local_batch(params, 2e8, headroom=0.0)
    budget = memory.device_budget_bytes(2e8, grad_bytes=2e7, num_workers=2, in_use_bytes=1e7)
    assert full == 100 and memory.max_local_batch(params, budget, headroom=0.0) == 70


@pytest.mark.parametrize("kwargs, message", [
    ({"device_bytes": 1 * GB, "grad_bytes": 0, "num_workers": 1, "in_use_bytes": 1 * GB},
     "nothing is left for training"),
    ({"device_bytes": 0, "grad_bytes": 0, "num_workers": 1}, "device_bytes=0"),
    ({"device_bytes": 1 * GB, "grad_bytes": 0, "num_workers": 0}, "num_workers=0"),
    ({"device_bytes": 1 * GB, "grad_bytes": -1, "num_workers": 2}, "grad_bytes=-1"),
])
def test_bad_budgets_are_named(kwargs, message):
    device_bytes = kwargs.pop("device_bytes")
    with pytest.raises(ValueError, match=message):
        memory.device_budget_bytes(device_bytes, **kwargs)


def test_cuda_memory_in_use_is_total_minus_free(monkeypatch):
    # No GPU here: torch.cuda's calls are replaced by a 16 GB device with 15.2 GB free.
    from tula_ray.training import measure

    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (15.2 * GB, 16 * GB))
    assert measure.device_in_use_bytes("cuda:0") == pytest.approx(0.8 * GB)
    assert calls == ["empty_cache"]  # the allocator's cached blocks are not "in use"
    assert measure.device_in_use_bytes("cpu") == 0.0


def test_a_cuda_try_resets_the_reserved_peak_after_emptying_the_cache(monkeypatch):
    # No GPU here: the order is what counts. reset_peak_memory_stats sets the peak to the
    # memory reserved now, so an earlier try's cached blocks must be released before it.
    from tula_ray.training import measure

    calls = []
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name,
                            lambda *args, name=name: calls.append(name))
    measure.reset_reserved_peak(torch.device("cuda:0"))
    assert calls == ["synchronize", "empty_cache", "reset_peak_memory_stats"]


# ------------------------------------------------- each cost counted once (issue 26 item 3)

def test_a_cuda_peak_holding_ddp_buckets_is_checked_without_them():
    # The budget took the buckets off already: max_memory_allocated holds them too.
    budget = memory.device_budget_bytes(10 * GB, grad_bytes=1 * GB, num_workers=2)
    assert memory.over_budget(9.5 * GB, budget, bucket_bytes=1 * GB) == ""
    assert "device_memory_bytes" in memory.over_budget(9.5 * GB, budget)  # counted twice
    assert memory.budget_peak_bytes(9.5 * GB, bucket_bytes=1 * GB) == 8.5 * GB


def test_a_dataset_kept_on_the_gpu_is_counted_once():
    """Issue 46: the probe counts the dataset the data path keeps on the GPU in the memory
    in use (off the budget); a row's CUDA peak holds it too, so it is taken off there."""
    from tula_ray.training.batches import TensorSource

    data = [torch.zeros(1000, 250), torch.zeros(1000, dtype=torch.int64)]  # 1 MB + 8 kB
    on_gpu = TensorSource(data, None, torch.device("cpu"), "device")  # placed "on the GPU"
    assert on_gpu.device_bytes == 1_008_000
    assert TensorSource(data, None, torch.device("cpu"), "pinned").device_bytes == 0
    budget = memory.device_budget_bytes(10 * GB, grad_bytes=0, num_workers=1,
                                        in_use_bytes=on_gpu.device_bytes)
    peak = budget + 0.5 * on_gpu.device_bytes  # the model's share fits; with the data twice not
    assert memory.over_budget(peak, budget, resident_bytes=on_gpu.device_bytes) == ""
    error = memory.over_budget(peak, budget)
    assert "device_memory_bytes" in error and "dataset" not in error
    assert "less the dataset on the device" in memory.over_budget(
        peak + GB, budget, resident_bytes=on_gpu.device_bytes)
    with pytest.raises(ValueError, match="resident_bytes=-1"):
        memory.budget_peak_bytes(GB, resident_bytes=-1)


def test_measured_nccl_buffers_replace_the_budgeted_constant():
    constant = memory.NCCL_BUFFER_BYTES_DEFAULT
    assert memory.budget_peak_bytes(GB, nccl_buffer_bytes=None) == GB  # constant stands
    assert memory.budget_peak_bytes(GB, nccl_buffer_bytes=float("nan")) == GB
    assert memory.budget_peak_bytes(GB, nccl_buffer_bytes=constant + 5e6) == GB + 5e6
    assert memory.budget_peak_bytes(GB, nccl_buffer_bytes=constant - 5e6) == GB - 5e6
    error = memory.over_budget(GB, GB + 1e6, nccl_buffer_bytes=constant + 5e6)
    assert "NCCL" in error and "device_memory_bytes" in error
    measured = memory.device_budget_bytes(32 * GB, grad_bytes=0, num_workers=2, nccl=True,
                                          nccl_buffer_bytes=2e8)
    assert measured == 32 * GB - 2e8
    assert memory.device_budget_bytes(32 * GB, grad_bytes=0, num_workers=2, nccl=True) \
        == 32 * GB - constant
    with pytest.raises(ValueError, match="bucket_bytes=-1"):
        memory.budget_peak_bytes(GB, bucket_bytes=-1)


def test_nccl_buffers_are_measured_around_a_bucket_sized_all_reduce(monkeypatch):
    """NCCL >= 2.22 connects its channels at the first collective that needs them: the
    measurement all-reduces DDP's bucket (25 MiB, or a smaller model's gradients), and
    the fall of free memory less the bucket's own bytes (the allocator's) is NCCL's."""
    from tula_ray.training import measure

    bucket_bytes = measure.ddp_bucket_bytes(torch.nn.Linear(10_000, 1_000))  # 40 MB of weights
    assert bucket_bytes == measure.DDP_BUCKET_CAP_BYTES == 25 * 2**20
    assert measure.ddp_bucket_bytes(torch.nn.Linear(10, 2)) == (10 * 2 + 2) * 4
    reserved = [1e9]
    free = iter([10 * GB, 10 * GB - 300e6 - bucket_bytes])  # NCCL's 300 MB and the bucket
    reduced, made = [], []

    def zeros(count, dtype, device):  # the allocator reserves the bucket: reserved grows
        made.append((count, dtype, torch.device(device).type))
        reserved[0] += count * 4
        return torch.zeros(count, dtype=dtype)  # a CPU stand-in for the GPU's tensor

    monkeypatch.setattr(measure, "synchronize", lambda device: None)
    taken = measure.collective_buffer_bytes(
        "cuda", lambda tensor: reduced.append(tensor.numel() * tensor.element_size()),
        bucket_bytes=bucket_bytes, zeros=zeros,
        mem_get_info=lambda device: (next(free), 80 * GB),
        memory_reserved=lambda device: reserved[0])
    assert made == [(bucket_bytes // 4, torch.float32, "cuda")]
    assert reduced == [bucket_bytes]  # not a 1-element all-reduce
    assert taken == pytest.approx(300e6)
    assert measure.collective_buffer_bytes("cpu", reduced.append, bucket_bytes=4) is None
    assert reduced == [bucket_bytes]  # no collective measured on CPU
    same = measure.collective_buffer_bytes(  # a communicator made before: nothing to see
        "cuda", lambda tensor: None, bucket_bytes=8, zeros=lambda n, **_: torch.zeros(n),
        mem_get_info=lambda device: (GB, 80 * GB), memory_reserved=lambda device: 0)
    assert same is None
    with pytest.raises(ValueError, match="bucket_bytes"):
        measure.collective_buffer_bytes("cuda", reduced.append, bucket_bytes=0)

def test_the_budget_covers_the_training_strategys_optimizer_state():
    """The probe steps the workload's SGD; `train` with AGS per element keeps a scale per
    weight beyond it (issue 46, item 2): measured on the worker, taken off the budget."""
    from tula_ray.planning import bounds
    from tula_ray.training import probe_task
    from tula_ray.workloads import resolve_workload
    from trainables.memory_probe import _check_and_measure  # the probe's task body, no Ray

    workload = resolve_workload("fashion-mnist-cnn-fake", {"fake_size": 64})
    weights = sum(p.numel() * p.element_size() for p in workload.model_fn().parameters())
    assert probe_task.strategy_state_bytes(workload, "lbt", {}) == 0  # the workload's own
    per_element = {"granularity": "element"}
    extra = probe_task.strategy_state_bytes(workload, "ags", per_element)
    assert weights <= extra <= weights + 1000  # one scale per weight, a few scalars more

    def budget(*strategy) -> float:
        measured = _check_and_measure(workload, {}, [2, 4], False, *strategy)
        return bounds.memory_budget_bytes(bounds.fitted_probe(measured), declared_gb=1.0,
                                          num_workers=1, use_gpu=False, cpu_share_bytes=GB)

    assert budget() - budget("ags", per_element) == pytest.approx(extra)
