"""The search's bounds without Ray (tula_ray.planning.bounds, issue 42 step 2): eq. 3 on
the probe's peaks, the device budget, the cap, the bound check (up to the largest
candidate's local batch, the model's own limit), and the space up to the bound, on
made-up measurements a worker would have sent."""

import logging

import pytest

from tula_ray.failures import UserCodeError
from tula_ray.models import memory
from tula_ray.planning import bounds
from tula_ray.space import SearchSpace

GB = 1e9
STATIC = memory.StaticMemory(param_bytes=40_000_000, grad_bytes=40_000_000,
                             optimizer_bytes=20_000_000)
PER_SAMPLE_BYTES = 1e6


def linear_peak(b: int) -> float:
    """A model whose peak is eq. 3 exactly: the static terms and 1 MB per sample."""
    return STATIC.total_bytes + PER_SAMPLE_BYTES * b


def measured_on_worker(local_batches=(16, 32, 64), peak=linear_peak, refused=None,
                       gpu_bytes=None, in_use_bytes=0.0) -> dict:
    """What `trainables.memory_probe` gets back from its worker (`measure.probe_peaks`)."""
    refused = dict(refused or {})
    ran = [b for b in local_batches if b not in refused]
    return {"local_batches": ran, "peaks": [peak(b) for b in ran], "refused": refused,
            "static": STATIC, "input_bytes_per_sample": 0.0, "workload": None, "facts": None,
            "device_memory_bytes": gpu_bytes, "device_in_use_bytes": in_use_bytes}


def refusing_above(most: int, calls: list):
    """A bound check's measurement: linear peaks; the model's code refuses b > most."""
    def measure_peak(b: int) -> float:
        calls.append(b)
        if b > most:
            raise UserCodeError(f"workload 'mine': memory probe at local batch {b} raised "
                                f"AssertionError: batch {b} > {most}")
        return linear_peak(b)
    return measure_peak


def test_the_probe_fits_eq_3_on_its_peaks():
    probe = bounds.fitted_probe(measured_on_worker(), check_s=0.5)
    assert probe.params.bytes_per_sample == pytest.approx(PER_SAMPLE_BYTES)
    assert [row["local_batch"] for row in probe.rows] == [16, 32, 64]
    assert probe.rows[-1]["predicted_peak_mem_bytes"] == pytest.approx(linear_peak(64))
    assert (probe.check_s, probe.static, probe.max_local_batch) == (0.5, STATIC, None)


def test_a_probe_with_one_batch_that_ran_names_the_refusal():
    refused = {32: "workload 'mine': memory probe at local batch 32 raised AssertionError",
               64: "workload 'mine': memory probe at local batch 64 raised AssertionError"}
    with pytest.raises(UserCodeError, match="while local batch 16 ran: the memory probe "
                                            "needs two batches"):
        bounds.fitted_probe(measured_on_worker(refused=refused))


def test_the_probe_starts_at_min_batch_over_the_largest_n():
    assert bounds.probe_min_local_batch(32, (1, 2, 4)) == 8
    assert bounds.probe_min_local_batch(2, (1, 4)) == 1  # never below one sample


def test_the_budget_is_the_declared_device_else_the_gpu_else_the_cpu_share():
    probe = bounds.fitted_probe(measured_on_worker(gpu_bytes=80 * GB, in_use_bytes=GB))

    def budget(declared_gb, use_gpu=True, num_workers=1):
        return bounds.memory_budget_bytes(probe, declared_gb=declared_gb,
                                          num_workers=num_workers, use_gpu=use_gpu,
                                          cpu_share_bytes=16 * GB)

    assert budget(10.0) == 9 * GB  # declared, less the CUDA context the probe found
    assert budget(None) == 79 * GB  # the GPU's own size
    assert budget(None, num_workers=2) == memory.device_budget_bytes(
        80 * GB, grad_bytes=STATIC.grad_bytes, num_workers=2, in_use_bytes=GB, nccl=True)
    on_cpu = bounds.fitted_probe(measured_on_worker())
    assert bounds.memory_budget_bytes(on_cpu, declared_gb=None, num_workers=2, use_gpu=False,
                                      cpu_share_bytes=16 * GB) == 16 * GB - STATIC.grad_bytes


def test_the_cap_is_max_batch_never_above_the_dataset():
    assert bounds.largest_global_batch(None, 1000) == 1000
    assert bounds.largest_global_batch(4096, 1000) == 1000
    assert bounds.largest_global_batch(256, 1000) == 256
    space = bounds.candidate_space((1, 2), min_batch=32, max_batch=None, dataset_size=1000)
    assert space.batch_sizes == (32, 64, 128, 256, 512)


def test_the_bound_check_measures_up_to_the_largest_candidates_local_batch_only():
    """A roomy device: the bound is the largest candidate's local batch (B = 256 on N = 1),
    measured once, never above; eq. 3 is refitted with it."""
    probe = bounds.fitted_probe(measured_on_worker())
    candidates = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
    calls = []
    probe = bounds.checked_bound(probe, refusing_above(10**6, calls), 100 * GB,
                                 headroom=0.1, space=candidates)
    assert probe.max_local_batch == 256 and calls == [256]
    assert probe.bound_checks == [{"local_batch": 256, "peak_mem_bytes": linear_peak(256)}]
    assert [row["bound_check"] for row in probe.rows] == [False, False, False, True]
    assert probe.batch_limit is None


def test_the_bound_check_pulls_the_bound_under_a_small_device():
    probe = bounds.fitted_probe(measured_on_worker())
    candidates = SearchSpace.build((1, 2), min_batch=32, max_batch=1024)
    device = linear_peak(200) + PER_SAMPLE_BYTES / 2  # room for b = 200, not 201
    calls = []
    probe = bounds.checked_bound(probe, refusing_above(10**6, calls), device, headroom=0.0,
                                 space=candidates)
    assert probe.max_local_batch == 200 and calls == [200]  # eq. 3 exact: one check


def convex_peak(b: int) -> float:
    """A model whose activations grow faster than linearly: the line fitted on the probe's
    b <= 64 under-predicts large batches, as it did on an H100 (issue 46)."""
    return STATIC.total_bytes + PER_SAMPLE_BYTES * b + 2e3 * b * b


def test_on_a_gpu_the_bound_is_found_by_doubling_and_bisection():
    """doubling=True (a GPU): no extrapolated line; the bound is a measured batch within
    5 % under the true one, and the plan's peaks come from the curve through every
    measured point, which is exact at them and above the line beyond the probe."""
    probe = bounds.fitted_probe(measured_on_worker(peak=convex_peak))
    candidates = SearchSpace.build((1, 2), min_batch=32, max_batch=8192)  # local b <= 8192
    device = convex_peak(3000)  # the true bound: 3000
    calls = []

    def measure_peak(b: int) -> float | None:
        calls.append(b)
        return None if convex_peak(b) > device else convex_peak(b)  # None: out of memory

    assert memory.max_local_batch(probe.params, device, 0.0) > 5000  # the line overshoots
    probe = bounds.checked_bound(probe, measure_peak, device, headroom=0.0, space=candidates,
                                 doubling=True)
    assert 0.95 * 3000 <= probe.max_local_batch <= 3000
    assert calls[:6] == [128, 256, 512, 1024, 2048, 4096] and len(calls) <= 6 + 6
    assert probe.batch_limit is None
    fitted = [b for b in calls if convex_peak(b) <= device]
    assert memory.predict_peak_bytes(probe.params, fitted) == pytest.approx(
        [convex_peak(b) for b in fitted])
    assert memory.predict_peak_bytes(probe.params, 8192) > memory.line_peak_bytes(
        memory.fit_probe([(b, convex_peak(b)) for b in (16, 32, 64)], STATIC, 0.0), 8192)


def test_the_models_own_limit_bounds_the_search_with_a_warning(caplog):
    """A forward asserting b <= 256 under B up to 4096 (N 1, 2): bound 256, the limit kept
    with its error, and a warning naming the max_batch that skips the check."""
    probe = bounds.fitted_probe(measured_on_worker())
    candidates = SearchSpace.build((1, 2), min_batch=32, max_batch=4096)
    calls = []
    with caplog.at_level(logging.WARNING):
        probe = bounds.checked_bound(probe, refusing_above(256, calls), 100 * GB,
                                     headroom=0.1, space=candidates)
    assert probe.max_local_batch == 256 and calls == [4096, 512, 256]
    assert probe.batch_limit.local_batch == 512
    assert "batch 512 > 256" in probe.batch_limit.error
    assert "pass max_batch=256" in caplog.text
    space = bounds.bounded_space(candidates, probe.max_local_batch, min_batch=32,
                                 device_bytes=100 * GB, headroom=0.1)
    assert space.batch_sizes == (32, 64, 128, 256, 512)  # B <= 256 x the largest N


def test_min_batch_that_does_not_fit_is_an_error_naming_the_memory():
    candidates = SearchSpace.build((1, 2), min_batch=64, max_batch=256)
    with pytest.raises(ValueError, match=r"min_batch=64 does not fit: the memory model allows "
                                         r"at most a local batch of 16 \(0\.5 GB device "
                                         r"memory, headroom 10%\), so B <= 32"):
        bounds.bounded_space(candidates, 16, min_batch=64, device_bytes=0.5 * GB, headroom=0.1)
    kept = bounds.bounded_space(candidates, 32, min_batch=64, device_bytes=GB, headroom=0.1)
    assert kept.batch_sizes == (64,)  # 32 x N = 2
