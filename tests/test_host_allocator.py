"""glibc's malloc held steady in every process that profiles or trains (issue 43: the
profile's first batch read the adaptive thresholds' slow steps)."""

import sys

import pytest

from tula_ray.training import host_allocator
from tula_ray.training.host_allocator import (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD,
                                              THRESHOLD_BYTES, _apply)


def test_steady_fixes_both_thresholds(monkeypatch):
    calls = []
    monkeypatch.setattr(host_allocator, "_glibc_mallopt",
                        lambda: lambda param, value: calls.append((param, value)) or 1)
    assert _apply("steady") == "steady"
    assert calls == [(M_MMAP_THRESHOLD, THRESHOLD_BYTES), (M_TRIM_THRESHOLD, THRESHOLD_BYTES)]


def test_default_leaves_glibc_alone_and_a_refusal_is_said(monkeypatch):
    def no_call():
        raise AssertionError("mallopt looked up under TULA_RAY_HOST_ALLOCATOR=default")

    monkeypatch.setattr(host_allocator, "_glibc_mallopt", no_call)
    assert _apply("default") == "default"
    monkeypatch.setattr(host_allocator, "_glibc_mallopt", lambda: lambda param, value: 0)
    assert _apply("steady") == "mallopt refused"
    monkeypatch.setattr(host_allocator, "_glibc_mallopt", lambda: None)
    assert _apply("steady") == "not glibc"


def test_an_unknown_setting_names_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"TULA_RAY_HOST_ALLOCATOR='fast'.*'steady'.*'default'"):
        _apply("fast")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_this_machines_glibc_takes_the_thresholds():
    assert host_allocator._glibc_mallopt() is not None
    assert _apply("steady") == "steady"


def test_a_run_and_a_profile_both_hold_it_steady(monkeypatch):
    """`fit` (as the Ray worker loop, through prepare_run) and the profile's Sweep."""
    from tula_ray.training import profile_sweep, run
    from tula_ray.training.profile_settings import ProfileSettings
    from tula_ray.workloads import get_workload

    called = []
    for module in (run, profile_sweep):
        monkeypatch.setattr(module, "steady_host_allocator",
                            lambda module=module: called.append(module.__name__))
    workload = get_workload("fashion-mnist-cnn-fake", fake_size=64)
    run.fit(workload, global_batch=32, strategy="lbt", epochs=1)
    profile_sweep.Sweep(ProfileSettings(workload=workload),
                        profile_sweep.SweepWorker.of_process_group(), first_batch=32)
    assert called == [run.__name__, profile_sweep.__name__]
