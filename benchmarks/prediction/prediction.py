"""Issue 5 and issue 11 (item 5) figures: accuracy of the performance model (paper eq. 2,
4a; §IV-C, Fig. 9 and 11b), the quality of the configuration each search strategy selects
(§III-A3), and what each strategy costs, full, partial and adaptive side by side in one run.

For each workload ONE full search (`tula_ray.search(search_strategy="full")`, N in {1, 2}, B from
32) measures every candidate: that grid is the ground truth.
Model accuracy, from its profiles:
  full model:     the search's own fit on every profiled candidate (`Plan.perf`);
  partial model:  the fit on the SAME search's corner rows (min/max N x min/max B).
                  Both models see the same measurements, so their difference is model
                  error only, not the ~15 % run-to-run noise between two searches.
Selection (regret), per objective and pricing, by REPLAY: each strategy's rounds are run
against the full grid's measurements (`benchmarks.prediction.replay`: the strategy
proposes, the grid's row for each proposed candidate is handed back), and its plan chooses.
So every strategy sees the same measurements and the regret is the strategy's, not
run-to-run noise. The
oracle is `policy.choose` on the measured grid. Regret = (measured metric of the choice - the
oracle's) / the oracle's; the metric is training time (time, knee) or cost; for the knee it
is signed (a knee is not a minimum, so a choice can train faster than the oracle's knee).
Search cost, LIVE (full run only): a partial and an adaptive search (the search's default
objective, the knee, fixed pricing) run right after the full one on the same Ray: launches,
candidates, profiling wall time; seconds per extra candidate at an already-launched N (its
wall time inside the worker group less its own warm-up and timed steps); and the live
searches' own choices, measured on the full grid.
Writes prediction.{json,md}, and per workload prediction_<workload>.png and the full
search's plan, prediction_<workload>.plan.json (`tula_ray.Plan.from_json`); the figure,
the goals and the markdown are `benchmarks.prediction.prediction_report`'s.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import (RESULTS_DIR, Benchmark, cross_search_errors, provenance,
                               relative_errors, spread)
from benchmarks.prediction.prediction_report import plot as plot_workload, report
from benchmarks.prediction.replay import (KEY, OBJECTIVES, STRATEGIES, measured_at, metric_of,
                                          recorded_search, regret, replay)
from tula_ray.models.pricing import (USD_PER_GB_HOUR_DEFAULT, USD_PER_NODE_HOUR_DEFAULT, FixedRate,
                              MemoryRate)
from tula_ray.planning.context import PRICING_DEFAULT

NAME = "prediction"
SEARCH = dict(cluster_sizes=(1, 2), min_batch=32)  # the demo's grid (NOTES-ENV: 2 cores)
# Workload -> its search's max_batch and train_subset. train_subset keeps data loading and
# D of eq. 4a small; step times do not depend on it. resnet18 stops at B = 1024 (a ~2 s
# step on N = 1 here); the CNN goes to the demo's 2048.
WORKLOADS = {"fashion-mnist-cnn": {"max_batch": 2048, "train_subset": 10000},
             "resnet18-fashion-mnist": {"max_batch": 1024, "train_subset": 10000}}
QUICK_WORKLOADS = {"fashion-mnist-cnn": {"max_batch": 64, "train_subset": 2048}}
PRICINGS = {f"fixed ${USD_PER_NODE_HOUR_DEFAULT}/node-h": FixedRate(USD_PER_NODE_HOUR_DEFAULT),
            f"memory ${USD_PER_GB_HOUR_DEFAULT}/GB-h": MemoryRate(USD_PER_GB_HOUR_DEFAULT)}
MODELS = ("full", "partial")  # the two fits compared candidate by candidate
# Of a search's Plan.meta; "trials" are worker-group launches (one per N and round).
WALL_KEYS = ("trials", "probe_wall_s", "profiling_wall_s", "candidates_profiled", "rounds",
             "stop_reason")


def measured_table(table: pd.DataFrame, pricing) -> pd.DataFrame:
    """The candidate table with the measurements in place of the predictions (the oracle's)."""
    oracle = table.copy()
    peak = oracle["measured_peak_mem_bytes"].where(oracle["measured_peak_mem_bytes"] > 0,
                                                   oracle["peak_mem_bytes"])
    oracle["step_time_s"] = oracle["measured_step_time_s"]
    oracle["total_time_s"] = oracle["measured_total_time_s"]
    oracle["peak_mem_bytes"] = peak
    oracle["cost_usd"] = pricing.cost_usd(oracle["total_time_s"].to_numpy(float),
                                          oracle["num_workers"].to_numpy(float),
                                          peak.to_numpy(float))
    oracle["feasible"] = oracle["feasible"] & oracle["total_time_s"].notna()
    return oracle


def _measured_pick(indexed: pd.DataFrame, choice, metric: str) -> dict:
    return {"num_workers": choice.num_workers, "global_batch": choice.global_batch,
            "measured": measured_at(indexed, choice, metric),
            "knee_global_batch": choice.knee_global_batch, "ties": [list(t) for t in choice.ties]}


def _selection(full_plan) -> list[dict]:
    """Per objective and pricing: the oracle's pick and each strategy's (by replay)."""
    from tula_ray.planning.policy import choose

    (space, recorded), rows = recorded_search(full_plan), []
    for label, pricing in PRICINGS.items():
        oracle_table = measured_table(full_plan.table, pricing)
        indexed = oracle_table.set_index(KEY)
        for objective in OBJECTIVES:
            metric = metric_of(objective)
            row = {"objective": objective, "pricing": label, "metric": metric,
                   "oracle": _measured_pick(indexed, choose(oracle_table, objective), metric)}
            for strategy in STRATEGIES:
                context = replace(recorded, objective=objective, pricing=pricing)
                plan, measured, rounds, reason = replay(space, context, full_plan.profiles,
                                                        strategy)
                row[strategy] = {**_measured_pick(indexed, plan.choice, metric),
                                 "candidates": len(measured), "rounds": rounds,
                                 "stop_reason": reason}
            best = row["oracle"]["measured"]
            for strategy in STRATEGIES:
                row[f"{strategy}_regret"] = regret(row[strategy]["measured"], best)
            rows.append(row)
    return rows


def _accuracy(full_plan) -> tuple[pd.DataFrame, dict]:
    """Per-candidate predictions of both models against the measurements, and a summary."""
    from tula_ray.planning.search_strategies import make_search_strategy

    space, recorded = recorded_search(full_plan)
    # the recorded search's objective, priced at the context's default (as before)
    context = replace(recorded, objective=full_plan.objective, pricing=PRICING_DEFAULT)
    partial, _, _, _ = replay(space, context, full_plan.profiles, "partial")
    table = full_plan.table.merge(
        partial.table[["num_workers", "global_batch", "step_time_s", "total_time_s"]],
        on=["num_workers", "global_batch"], suffixes=("_full", "_partial"))
    table = table[table["measured_step_time_s"].notna()].reset_index(drop=True)
    corner_rows = make_search_strategy("partial").fit_rows(full_plan.profiles)
    corners = set(zip(corner_rows["num_workers"], corner_rows["global_batch"]))
    table["corner"] = [(n, b) in corners
                       for n, b in zip(table["num_workers"], table["global_batch"])]
    summary = {}
    for m, params in (("full", full_plan.perf), ("partial", partial.perf)):
        errors = relative_errors(table[f"step_time_s_{m}"], table["measured_step_time_s"])
        table[f"{m}_rel_error"] = errors
        summary[m] = {"median_rel_error": float(np.median(errors)),
                      "max_rel_error": float(errors.max()), "spread": spread(errors),
                      "loo_median_rel_error": params.loo_median_rel_error,
                      "form": params.form, "num_profiles": params.num_profiles}
    off = table.loc[~table["corner"], "partial_rel_error"]
    summary["partial"]["median_rel_error_off_corners"] = float(off.median()) if len(off) else None
    return table, summary


def extra_candidate_seconds(profiles: pd.DataFrame) -> list[float]:
    """Per candidate after the first of its worker group: its wall time inside the group
    less its own warm-up and timed steps (memory check, data loader, reports)."""
    rows = profiles.dropna(subset=["round", "profile_wall_s", "timed_wall_s"])
    rows = rows[rows["status"] == "ok"].sort_values(["round", "num_workers", "global_batch"])
    extra = []
    for _, sweep in rows.groupby(["round", "num_workers"]):
        later = sweep.iloc[1:]
        extra += (later["profile_wall_s"] - later["warmup_wall_s"].fillna(0)
                  - later["timed_wall_s"]).tolist()
    return extra


def _live_cost(plan, full_plan) -> dict:
    """What one live search cost, and its own choice measured on the full grid."""
    from tula_ray.planning.policy import choose

    oracle = measured_table(full_plan.table, FixedRate())
    indexed = oracle.set_index(KEY)
    best = choose(oracle, plan.objective)
    pick = _measured_pick(indexed, plan.choice, "total_time_s")
    best_s = measured_at(indexed, best, "total_time_s")
    extra = extra_candidate_seconds(plan.profiles)
    return {**{k: plan.meta[k] for k in WALL_KEYS}, "launch_wall_s":
            plan.profiles.groupby(["round", "num_workers"])["launch_wall_s"].max().tolist(),
            "extra_candidate_s": extra, "choice": pick, "choice_tie_break": plan.choice.tie_break,
            "regret_vs_full_grid": regret(pick["measured"], best_s)}


def _saved_plans(name: str) -> dict:
    """The plans a full run saved for `name`: its full search and its live searches."""
    from tula_ray.planning.plan import Plan

    return {s: Plan.from_json(RESULTS_DIR / (f"{NAME}_{name}.plan.json" if s == "full" else
                                             f"{NAME}_{name}_{s}.plan.json"))
            for s in STRATEGIES}


def _one_workload(name: str, settings: dict, quick: bool, scratch: Path, full=None,
                  saved: dict | None = None) -> dict:
    import tula_ray

    options = dict(**SEARCH, max_batch=settings["max_batch"],
                   workload_options={"train_subset": settings["train_subset"]})
    live = dict(saved or {})
    for strategy in () if saved else STRATEGIES if not quick else ("full",) * (full is None):
        live[strategy] = tula_ray.search(
            name, search_strategy=strategy, storage_path=str(scratch / f"{name}-{strategy}"),
            **options)
    full = full or live["full"]
    if not saved:  # what measured them, for a re-analysis (--from-saved) to say
        for plan in live.values():
            plan.meta["measured_by"] = {**provenance(),
                                        "load_avg_1min": list(os.getloadavg()[:1])}
    suffix = "_quick" if quick else ""
    # The full search's plan (profiles, fits, measurements): selection and fits can be
    # re-analysed from it without profiling again.
    plan_json = f"{NAME}_{name}{suffix}.plan.json"
    full.to_json(RESULTS_DIR / plan_json)
    table, accuracy = _accuracy(full)
    cost = {"full": {k: full.meta.get(k) for k in WALL_KEYS}, "live": {}, "ratios": {}}
    if not quick:
        for strategy, plan in live.items():  # the live searches' plans, for re-analysis
            if strategy != "full":
                plan.to_json(RESULTS_DIR / f"{NAME}_{name}_{strategy}.plan.json")
        cost["live"] = {s: _live_cost(plan, full) for s, plan in live.items()}
        wall = {s: plan.meta["profiling_wall_s"] for s, plan in live.items()}
        cost["ratios"] = {"partial_over_full": wall["partial"] / wall["full"],
                          "full_over_partial": wall["full"] / wall["partial"],
                          "adaptive_over_full": wall["adaptive"] / wall["full"]}
        _, errors = cross_search_errors(live["partial"], full)
        cost["partial_vs_full_measured_spread"] = spread(errors)
    plot = f"{NAME}_{name}{suffix}.png"
    plot_workload(full, table, RESULTS_DIR / plot)
    columns = ["num_workers", "global_batch", "local_batch", "corner", "measured_step_time_s",
               "step_time_s_full", "step_time_s_partial", "measured_total_time_s",
               "total_time_s_full", "total_time_s_partial", "full_rel_error", "partial_rel_error"]
    return {"workload": name, "options": {**settings, **SEARCH}, "epochs": full.epochs,
            "dataset_size": full.dataset_size, "max_local_batch": full.meta.get("max_local_batch"),
            "batch_sizes": sorted(full.table["global_batch"].unique().tolist()),
            "per_candidate": table[columns].to_dict("records"), "accuracy": accuracy,
            "selection": _selection(full), "search_cost": cost, "plot": plot,
            "plan_json": plan_json}


def run(quick: bool = False, full_plans: dict | None = None, from_saved: bool = False) -> dict:
    """full_plans: {workload: Plan of a full search} to analyse instead of searching again
    (quick only: the test suite hands in the full search its own tests already ran).
    from_saved: analyse again the plans the last full run saved (its full and live
    searches, prediction_<workload>[_<strategy>].plan.json) without profiling again; the
    measurements, wall times and the date of that run are kept, the analysis is new."""
    if full_plans and not quick:
        raise ValueError("full_plans is for quick runs only; a full run measures its own grid")
    if from_saved:
        return _reanalyse()
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    if full_plans:
        workloads = {name: {"max_batch": int(plan.table["global_batch"].max()),
                            "train_subset": plan.meta["workload_options"].get("train_subset")}
                     for name, plan in full_plans.items()}
    from tula_ray.cluster import ray_session

    load_before = os.getloadavg()[0]  # the machine is shared: wall times depend on its load
    with tempfile.TemporaryDirectory() as scratch, ray_session():
        results = {name: _one_workload(name, settings, quick, Path(scratch),
                                       (full_plans or {}).get(name))
                   for name, settings in workloads.items()}
    return Benchmark(NAME, quick).record({"quick": quick, "workloads": results,
                                          "load_avg_1min": [load_before, os.getloadavg()[0]]},
                                         report)


def _reanalyse() -> dict:
    """The last full run's saved plans, analysed with the code as it is now."""
    saved = {name: _saved_plans(name) for name in WORKLOADS}
    stamps = [plan.meta.get("measured_by") for plans in saved.values() for plan in plans.values()]
    if not all(stamps):
        raise ValueError("the saved plans do not say what measured them (saved before "
                         "re-analysis was possible): run `python -m benchmarks prediction`")
    results = {name: _one_workload(name, settings, False, Path("."), saved=saved[name])
               for name, settings in WORKLOADS.items()}
    first, last = stamps[0], stamps[-1]
    return Benchmark(NAME).record({"quick": False, "workloads": results, "reanalysed": True,
                                   "measured": first, "load_avg_1min": [
                                       first["load_avg_1min"][0], last["load_avg_1min"][0]]},
                                  report)
