"""Goodput and the batch it chooses (tula_ray.models.goodput, issue 44)."""

import math

import pytest
from hypothesis import given, strategies as st

from tula_ray.models.goodput import (accumulation_steps, best_batch, goodput,
                                     switched_batch)


def test_goodput_is_throughput_times_efficiency():
    # phi = 96, M0 = 32, B = 128: E = 128 / 224
    assert goodput(1000.0, 96.0, 128, 32) == pytest.approx(1000.0 * 128 / 224)
    assert goodput(1000.0, 96.0, 32, 32) == pytest.approx(1000.0)  # E(M0) = 1
    assert goodput(1000.0, math.inf, 4096, 32) == 1000.0  # all noise: every sample counts


@given(st.floats(1.0, 1e5), st.integers(1, 4096), st.integers(1, 64))
def test_goodput_never_exceeds_throughput_above_the_reference(phi, batch, reference):
    if batch >= reference:
        assert goodput(500.0, phi, batch, reference) <= 500.0 + 1e-9


def test_accumulation_splits_a_local_batch_over_the_memory_bound():
    assert accumulation_steps(256, 2, None) == 1
    assert accumulation_steps(256, 2, 128) == 1
    assert accumulation_steps(256, 2, 64) == 2
    assert accumulation_steps(256, 2, 50) == 3  # 128 samples in micro-batches of <= 50


def test_the_best_batch_has_the_most_goodput_and_ties_go_to_the_smaller():
    assert best_batch({32: 1.0, 64: 3.0, 128: 2.0}) == 64
    assert best_batch({32: 2.0, 64: 2.0}) == 32
    assert best_batch({32: math.nan, 64: 1.0}) == 64
    with pytest.raises(ValueError, match="no batch has a known goodput"):
        best_batch({32: math.nan})


def test_a_switch_needs_the_gain_the_hysteresis_asks():
    goodputs = {32: 100.0, 64: 104.0, 128: 90.0}
    assert switched_batch(32, goodputs) == 32  # 4 % < 5 %
    assert switched_batch(32, {**goodputs, 64: 105.0}) == 64
    assert switched_batch(32, goodputs, min_gain=0.03) == 64
    assert switched_batch(None, goodputs) == 64
    assert switched_batch(256, goodputs) == 64  # no longer a candidate: the best
