"""Ground-truth profile rows written from the paper's equations here, never by calling
tula_ray.models.perf: the model tests then check perf against an independent statement of
eq. 2a-2c (and AdaptDL's overlap form), so a broken equation in perf cannot hide
behind the same broken code generating its data (issue 15).

tests/ has no __init__.py: the test modules import this one by name.
"""

import math

import numpy as np
import pandas as pd

# Eq. 2c: what sync time is proportional to, per collective, as the paper states it.
UNITS = {
    "ring": lambda n: 1.0 - 1.0 / n,  # ring all-reduce: (1 - 1/N)
    "ps": lambda n: float(n) if n > 1 else 0.0,  # central parameter server: N
    "tree-test": lambda n: math.log2(n),  # the custom collective a test registers
}


def paper_profiles(candidates, params, *, noise: float = 0.05, seed: int = 0,
                   bytes_per_sample: float = 3.0e5, static_bytes: float = 5.0e7) -> pd.DataFrame:
    """One profile row per candidate from `params`' numbers (a PerfParams used as a record).

    Compute (eq. 2b): intercept + per_sample x b^exponent of the curve of N (the pooled
    curve when N has none); sync (eq. 2c): units(N) x (beta0 + beta1 x b); step (eq. 2a):
    their sum, or (c^p + s^p)^(1/p) when overlap_p > 1. Noise is multiplicative, uniform
    in [1 - noise, 1 + noise], on compute and sync alike. Memory (eq. 3): linear in b.
    """
    rng = np.random.default_rng(seed)
    units = UNITS[params.collective]
    rows = []
    for c in candidates:
        n, b = c.num_workers, c.global_batch / c.num_workers
        curve = params.compute.get(n, params.compute_pooled)
        compute = curve.intercept_s + curve.per_sample_s * b ** curve.exponent
        sync = units(n) * (params.sync_per_unit_s + params.sync_per_unit_per_sample_s * b)
        compute *= rng.uniform(1 - noise, 1 + noise)
        sync *= rng.uniform(1 - noise, 1 + noise)
        p = params.overlap_p
        step = compute + sync if p == 1.0 else (compute ** p + sync ** p) ** (1.0 / p)
        rows.append({"num_workers": n, "global_batch": c.global_batch,
                     "local_batch": c.global_batch // n, "compute_time_s": compute,
                     "sync_time_s": step - compute, "step_time_s": step,
                     "peak_mem_bytes": static_bytes + bytes_per_sample * (c.global_batch // n),
                     "samples_per_s": c.global_batch / step, "status": "ok", "error": ""})
    return pd.DataFrame(rows)
