"""Issue 3 figures: the wall time of `tula-ray demo`, the profiling cost of partial
vs full search, and the error of partial-search predictions against the step
times the full search measured, on the demo grid (N in {1, 2}, B from 32).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import (cross_search_errors, provenance, relative_errors,
                               spread, write_result)

DEMO_MAX_BATCH = 2048  # the demo's default upper bound
QUICK_MAX_BATCH = 64


def _time_demo(max_batch: int, out: Path, storage: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tula_ray.cli", "demo", "--max-batch", str(max_batch),
                    "--out", str(out), "--storage-path", str(storage)],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _corner_refit_error(full_plan) -> np.ndarray:
    """Partial fit on the full search's own corner rows: the model's error without the
    run-to-run noise between two searches (same processes measured every point)."""
    from tula_ray import perf

    from tula_ray.search_strategies import make_strategy

    params = perf.fit(make_strategy("partial").fit_rows(full_plan.profiles))
    measured = full_plan.table
    predicted = perf.predict_step_s(params, measured["num_workers"], measured["local_batch"])
    return relative_errors(predicted, measured["measured_step_time_s"])


def run(quick: bool = False, plans: dict | None = None) -> dict:
    """plans: {"partial": Plan, "full": Plan} of searches already run, analysed instead of
    searching again (quick only: the test suite hands in its own); the demo is then not timed."""
    import tula_ray
    from tula_ray.cluster import ray_session

    if plans and not quick:
        raise ValueError("plans is for quick runs only; a full run times its own searches")
    max_batch = QUICK_MAX_BATCH if quick else DEMO_MAX_BATCH
    options = dict(workload="fashion-mnist-cnn", cluster_sizes=(1, 2), min_batch=32,
                   max_batch=max_batch, objective="knee")
    demo_s = None
    if plans is None:
        with tempfile.TemporaryDirectory() as scratch:
            scratch = Path(scratch)
            demo_s = _time_demo(max_batch, scratch / "demo", scratch / "ray_demo")
            with ray_session():
                plans = {strategy: tula_ray.search(**options, strategy=strategy,
                                                   storage_path=str(scratch / strategy))
                         for strategy in ("partial", "full")}
    partial, full = plans["partial"], plans["full"]
    merged, errors = cross_search_errors(partial, full)
    refit = _corner_refit_error(full)
    result = {
        **provenance(),
        "grid": {"cluster_sizes": [1, 2], "batch_sizes": sorted(full.table["global_batch"].unique().tolist())},
        "demo_wall_s": demo_s,
        "partial": {"trials": partial.meta["trials"], "profiling_wall_s": partial.meta["profiling_wall_s"],
                    "probe_wall_s": partial.meta["probe_wall_s"]},
        "full": {"trials": full.meta["trials"], "profiling_wall_s": full.meta["profiling_wall_s"],
                 "probe_wall_s": full.meta["probe_wall_s"],
                 "loo_median_rel_error": full.perf.loo_median_rel_error},
        "cost_ratio_partial_over_full": partial.meta["profiling_wall_s"] / full.meta["profiling_wall_s"],
        "partial_vs_full_median_rel_error": float(np.median(errors)),
        "partial_vs_full_max_rel_error": float(np.max(errors)),
        "corner_refit_median_rel_error": float(np.median(refit)),
        "measured_step_spread_median": float(full.profiles.get("step_time_spread", pd.Series([np.nan])).median())
        if "step_time_spread" in full.profiles else None,
        "per_candidate": merged[["num_workers", "global_batch", "step_time_s_partial",
                                 "measured_step_time_s_full"]].assign(rel_error=errors).to_dict("records"),
    }
    markdown = _markdown(result, errors, refit)
    write_result("search_cost" + ("_quick" if quick else ""), result, markdown)
    print(markdown)
    return result


def _markdown(r: dict, errors: np.ndarray, refit: np.ndarray) -> str:
    rows = "\n".join(
        f"| {c['num_workers']} | {c['global_batch']} | {c['step_time_s_partial'] * 1e3:.1f} | "
        f"{c['measured_step_time_s_full'] * 1e3:.1f} | {c['rel_error']:.1%} |"
        for c in r["per_candidate"])
    demo = "not timed" if r["demo_wall_s"] is None else f"{r['demo_wall_s']:.0f} s"
    return f"""### Search cost and partial-search accuracy (issue 3)

`{r['command']}` — commit {r['commit']}, {r['date']}, {r['machine']}

| figure | value |
|---|---|
| `tula-ray demo` wall time (install excluded, Ray start included) | {demo} |
| partial search: trials / profiling wall time | {r['partial']['trials']} / {r['partial']['profiling_wall_s']:.0f} s |
| full search: trials / profiling wall time | {r['full']['trials']} / {r['full']['profiling_wall_s']:.0f} s |
| profiling cost partial / full | {r['cost_ratio_partial_over_full']:.2f} |
| partial predictions vs full search's measured step times: median [min, max] | {spread(errors)} |
| partial fit on the full search's own corners (no run-to-run noise): median [min, max] | {spread(refit)} |
| full model leave-one-out error | {r['full']['loo_median_rel_error']:.1%} |

| N | B | partial predicted step (ms) | full measured step (ms) | error |
|---|---|---|---|---|
{rows}
"""
