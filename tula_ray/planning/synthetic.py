"""Profiles generated from known model parameters: ground truth for tests and offline demos.

Real step times are noisy (~15 % between processes, NOTES-ENV); here the noise is
multiplicative and uniform in [1 - noise, 1 + noise], on compute and sync alike.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tula_ray.models import perf
from tula_ray.profile_table import profile_frame
from tula_ray.space import Candidate


def synthetic_profiles(
    candidates: list[Candidate],
    params: perf.PerfParams,
    *,
    noise: float = 0.05,
    seed: int = 0,
    bytes_per_sample: float = 3.0e5,
    static_bytes: float = 5.0e7,
) -> pd.DataFrame:
    """One profile row per candidate, as a trainable would report it."""
    if not 0.0 <= noise < 1.0:
        raise ValueError(f"noise={noise!r}; it must be within [0, 1)")
    rng = np.random.default_rng(seed)
    rows = []
    for c in candidates:
        compute = float(perf.predict_compute_s(params, c.num_workers, c.local_batch))
        sync = float(perf.predict_sync_s(params, c.num_workers, c.local_batch))
        compute *= rng.uniform(1 - noise, 1 + noise)
        sync *= rng.uniform(1 - noise, 1 + noise)
        step = float(perf.combine_step_s(compute, sync, params.overlap_p))
        rows.append({
            **c.as_dict(),
            "compute_time_s": compute,
            "sync_time_s": step - compute,
            "step_time_s": step,
            "peak_mem_bytes": static_bytes + bytes_per_sample * c.local_batch,
            "samples_per_s": c.global_batch / step,
            "status": "ok",
        })
    return profile_frame(rows)


def example_params() -> perf.PerfParams:
    """A small CNN on 2 CPU workers, roughly as measured here (NOTES-ENV: ~150 us/sample)."""
    return perf.PerfParams(
        compute={1: perf.ComputeCurve(0.004, 150e-6), 2: perf.ComputeCurve(0.004, 260e-6)},
        compute_pooled=perf.ComputeCurve(0.004, 200e-6),
        sync_per_unit_s=0.008,
        collective="ring",
    )
