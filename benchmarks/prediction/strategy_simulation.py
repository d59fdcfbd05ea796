"""Issue 11, item 6: the search strategies past this machine, by simulation.

Synthetic profiles of the paper's own grid (N in {2, 4, 8, 16}, B from 32 to the memory
bound), drawn from a known model with GPU-like noise and launch costs, fed to the real
search strategy (`tula_ray.planning.search_strategies`, in the rounds the Tune adapter
runs it: one worker group per N, its batches smallest first; the grid stops at the memory
bound, so no simulated group runs out of memory) and the real planner (`build_plan`).
No Ray; the whole run takes seconds.

Ground truth (paper eq. 2a-2c, 4a), ResNet-50-like on one V100 per worker: compute
INTERCEPT_S + PER_SAMPLE_S * b, ring all-reduce SYNC_S * (1 - 1/N) (~100 MB of fp32
gradients over 10 Gb/s), a memory bound of MAX_LOCAL_BATCH samples per GPU (memory
grows STATIC_BYTES + BYTES_PER_SAMPLE * b). Noise: each launch (a process) draws a level
factor in [1 - noise, 1 + noise] and each row its own in [1 - noise/2, 1 + noise/2].
Profiling cost: LAUNCH_S per worker-group launch, and per profiled batch its warm-up and
timed steps at the true step time plus BATCH_OVERHEAD_S. Regret: of each strategy's
plan's choice, measured on the TRUE grid, against the choice on the true grid
(`policy.choose`), per objective and pricing; for the knee it is signed (on time). The
search's context (grid, strategy options, `build_plan`) and the regret are those of
`benchmarks.prediction.replay`, which the prediction benchmark's replay of recorded searches uses.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from benchmarks.common import Benchmark, markdown_table
from benchmarks.prediction.replay import (OBJECTIVES, STRATEGIES, grid, planned, regret_on,
                                          strategy_options)
from tula_ray.planning.context import OBJECTIVE_DEFAULT, PRICING_DEFAULT

NAME = "strategy_simulation"
CLUSTER_SIZES = (2, 4, 8, 16)  # paper §IV-B
MIN_BATCH = 32  # paper §IV-B
MAX_LOCAL_BATCH = 256  # ResNet-50, fp32, 16 GB V100
INTERCEPT_S, PER_SAMPLE_S, SYNC_S = 0.010, 0.0011, 0.16
STATIC_BYTES, BYTES_PER_SAMPLE = 0.4e9, 0.05e9
LAUNCH_S = 45.0  # a worker group on GPU nodes: processes, CUDA context, NCCL init
BATCH_OVERHEAD_S = 2.0  # loader, memory check, per batch inside a launched group
WARMUP_STEPS, MEASURE_STEPS = 3, 8  # the profiling loop's defaults, two timed phases
EPOCHS, DATASET = 100, 50_000  # CIFAR-10-sized training (eq. 4a)
MAX_ROUNDS = 1000  # as the Tune adapter: a strategy that never ends is a bug, not a hang
NOISES = (0.02, 0.05)
SEEDS = 20
QUICK_SEEDS = 1
# --quick, a smoke test: the paper's N up to 8 (a plan's fit, with its leave-one-out refits,
# grows with the square of the rows profiled: most of the run's time), one seed, one noise.
QUICK_CLUSTER_SIZES = (2, 4, 8)


def true_step_s(n, b):
    """Eq. 2a-2c, written here: compute a + c b plus ring sync s (1 - 1/N)."""
    return INTERCEPT_S + PER_SAMPLE_S * np.asarray(b, float) + SYNC_S * (1 - 1 / np.asarray(n, float))


def _search(cluster_sizes, batch_sizes, objective: str, pricing):
    """The simulated searches' grid and context: E and D, the memory probe's bound
    (candidates above it are infeasible, not profiled), the objective and pricing."""
    from tula_ray.planning.context import PlanContext
    from tula_ray.space import SearchSpace

    return (SearchSpace(tuple(cluster_sizes), tuple(batch_sizes)),
            PlanContext(epochs=EPOCHS, dataset_size=DATASET, max_local_batch=MAX_LOCAL_BATCH,
                        objective=objective, pricing=pricing))


def _truth_table(space, pricing):
    """Every candidate with its true training time and cost (the oracle's table)."""
    rows = []
    for c in space.candidates():
        step = float(true_step_s(c.num_workers, c.local_batch))
        rows.append({**c.as_dict(), "total_time_s": EPOCHS * math.ceil(DATASET / c.global_batch) * step,
                     "peak_mem_bytes": STATIC_BYTES + BYTES_PER_SAMPLE * c.local_batch,
                     "feasible": c.local_batch <= MAX_LOCAL_BATCH, "infeasible_reason": ""})
    table = pd.DataFrame(rows)
    table["cost_usd"] = pricing.cost_usd(table["total_time_s"].to_numpy(), table["num_workers"].to_numpy(float),
                                         table["peak_mem_bytes"].to_numpy())
    return table


def simulate(strategy: str, cluster_sizes, batch_sizes, noise: float, seed: int,
             objective: str = OBJECTIVE_DEFAULT, pricing=PRICING_DEFAULT) -> dict:
    """One search: rows, launches, profiling seconds, and its plan."""
    from tula_ray.planning.search_strategies import make_search_strategy
    from tula_ray.profile_table import profile_frame, profile_row

    space, context = _search(cluster_sizes, batch_sizes, objective, pricing)
    search = make_search_strategy(strategy, strategy_options(strategy, context))
    candidates = sorted(set(grid(space, context)))
    rng = np.random.default_rng(seed)
    rows: dict[tuple[int, int], dict] = {}  # (N, B) -> profile row, in the order measured
    seconds, launches, rounds = 0.0, 0, 0
    while rounds < MAX_ROUNDS:
        proposal = search.propose(candidates, profile_frame(rows.values()))
        fresh = [c for c in proposal.candidates if (c.num_workers, c.global_batch) not in rows]
        if not fresh:
            break
        rounds += 1
        for n, batches in _launches(fresh):
            level = rng.uniform(1 - noise, 1 + noise)
            launches += 1
            seconds += LAUNCH_S
            for b in batches:
                factor = level * rng.uniform(1 - noise / 2, 1 + noise / 2)
                compute = (INTERCEPT_S + PER_SAMPLE_S * b / n) * factor
                sync = SYNC_S * (1 - 1 / n) * factor
                step = compute + sync
                seconds += (WARMUP_STEPS + 2 * MEASURE_STEPS) * step + BATCH_OVERHEAD_S
                rows[n, b] = profile_row(n, b, {
                    "num_workers": n, "global_batch": b, "local_batch": b // n,
                    "status": "ok", "error": "", "compute_time_s": compute,
                    "sync_time_s": sync, "step_time_s": step, "samples_per_s": b / step,
                    "step_time_spread": noise, "round": rounds, "launch_wall_s": LAUNCH_S,
                    "profile_wall_s": BATCH_OVERHEAD_S,
                    "peak_mem_bytes": STATIC_BYTES + BYTES_PER_SAMPLE * b / n})
    frame = profile_frame(rows.values())
    plan = planned(space, context, frame, strategy)
    return {"plan": plan, "launches": launches, "profiling_s": seconds,
            "candidates": len(frame), "rounds": rounds}


def _launches(candidates) -> list[tuple[int, list[int]]]:
    """A round's worker groups, as the Tune adapter launches them: one per N, smallest
    first, each profiling its batches smallest first."""
    by_size: dict[int, set[int]] = {}
    for c in candidates:
        by_size.setdefault(c.num_workers, set()).add(c.global_batch)
    return [(n, sorted(batches)) for n, batches in sorted(by_size.items())]


def run(quick: bool = False) -> dict:
    from tula_ray.models.pricing import FixedRate, MemoryRate
    from tula_ray.space import geometric

    seeds = QUICK_SEEDS if quick else SEEDS
    cluster_sizes = QUICK_CLUSTER_SIZES if quick else CLUSTER_SIZES
    batches = geometric(MIN_BATCH, MAX_LOCAL_BATCH * cluster_sizes[-1])
    pricings = {"fixed": FixedRate(), "memory": MemoryRate()}
    table = []
    for noise in NOISES[-1:] if quick else NOISES:
        for strategy in STRATEGIES:
            for objective in OBJECTIVES:
                for label, pricing in pricings.items():
                    if objective != "cost" and label == "memory":
                        continue  # time and knee do not depend on the pricing
                    space, _ = _search(cluster_sizes, batches, objective, pricing)
                    truth = _truth_table(space, pricing)
                    runs = [simulate(strategy, cluster_sizes, batches, noise, seed, objective,
                                     pricing) for seed in range(seeds)]
                    regrets = [regret_on(truth, r["plan"].choice, objective) for r in runs]
                    table.append({
                        "noise": noise, "strategy": strategy, "objective": objective,
                        "pricing": label, "launches": float(np.median([r["launches"] for r in runs])),
                        "candidates": float(np.median([r["candidates"] for r in runs])),
                        "profiling_s": float(np.median([r["profiling_s"] for r in runs])),
                        "regret_median": float(np.median(regrets)),
                        "regret_max_abs": float(np.max(np.abs(regrets)))})
    growth = []
    grids = ((2, 4), QUICK_CLUSTER_SIZES) if quick else ((2, 4), (2, 4, 8), (2, 4, 8, 16),
                                                         (2, 4, 8, 16, 32))
    for sizes in grids:
        for max_local in (64,) if quick else (64, 256):
            b = geometric(MIN_BATCH, max_local * sizes[-1])
            for strategy in STRATEGIES:
                r = simulate(strategy, sizes, b, NOISES[-1], 0, "knee")
                growth.append({"cluster_sizes": list(sizes), "batch_sizes": len(b),
                               "max_local_for_grid": max_local, "strategy": strategy,
                               "launches": r["launches"], "candidates": r["candidates"],
                               "profiling_s": r["profiling_s"]})
    return Benchmark(NAME, quick).record({"quick": quick, "seeds": seeds, "grid": {
        "cluster_sizes": list(cluster_sizes), "batch_sizes": list(batches),
        "max_local_batch": MAX_LOCAL_BATCH}, "model": {
        "intercept_s": INTERCEPT_S, "per_sample_s": PER_SAMPLE_S, "sync_s": SYNC_S,
        "launch_s": LAUNCH_S, "batch_overhead_s": BATCH_OVERHEAD_S},
        "load_avg_1min": os.getloadavg()[0], "table": table, "growth": growth}, report)


def report(r: dict) -> str:
    table = markdown_table(
        ["noise", "strategy", "objective", "pricing", "launches", "candidates profiled",
         "profiling cost (s)", "regret median", "regret max abs"],
        [[f"{t['noise']:.0%}", t["strategy"], t["objective"], t["pricing"],
          f"{t['launches']:.0f}", f"{t['candidates']:.0f}", f"{t['profiling_s']:.0f}",
          f"{t['regret_median']:+.1%}", f"{t['regret_max_abs']:.1%}"] for t in r["table"]])
    growth = markdown_table(
        ["cluster sizes", "batch sizes", "strategy", "launches", "candidates profiled",
         "profiling cost (s)"],
        [[g["cluster_sizes"], g["batch_sizes"], g["strategy"], g["launches"], g["candidates"],
          f"{g['profiling_s']:.0f}"] for g in r["growth"]])
    m, grid = r["model"], r["grid"]
    return f"""### Search strategies on the paper's grid, by simulation (issue 11, item 6)

`{r['command']}` — commit {r['commit']}, {r['date']}, {r['machine']}; {r['seeds']} seeds per row
(no Ray; seconds of CPU).

Synthetic profiles from a known model (eq. 2a-2c: compute {m['intercept_s'] * 1e3:.0f} ms +
{m['per_sample_s'] * 1e3:.1f} ms x b, ring sync {m['sync_s'] * 1e3:.0f} ms x (1 - 1/N)), N in
{grid['cluster_sizes']}, B in {grid['batch_sizes']} (memory bound b <= {grid['max_local_batch']}:
larger local batches are not profiled), noise per launch and per row, {m['launch_s']:.0f} s per
worker-group launch and {m['batch_overhead_s']:.0f} s per batch inside it, fed through the real
`TulaSearcher` and `build_plan`. Profiling cost = simulated seconds (launches + steps).
Regret of the plan's choice on the true grid against the true grid's choice: median and
largest absolute over seeds (knee: signed, on training time).

{table}

How the cost grows with the grid (knee, 5 % noise, one seed):

{growth}
"""


if __name__ == "__main__":
    run()
