"""Issue 5 figures (parts 1 and 3): accuracy of the performance model (paper eq. 2, 4a;
§IV-C, Fig. 9 and 11b) and the quality of the configuration it selects (§III-A3).

For each workload ONE full search (`tula_ray.search(strategy="full")`, N in {1, 2}, B from 32)
measures every candidate: that grid is the ground truth. From its profiles:
  full model:     the search's own fit on every profiled candidate (`Plan.perf`);
  partial model:  `perf.fit` on the SAME search's corner rows (min/max N x min/max B: the
                  partial strategy's `fit_rows`), i.e. the same plan rebuilt with
                  `build_plan(strategy="partial")`.
                  Both models see the same measurements, so their difference is model
                  error only, not the ~15 % run-to-run noise between two searches
                  (NOTES-ENV); a separate partial search (full run only) adds that noise.
Selection: for each objective and pricing, the (N, B) that `build_plan` chooses from each
model's predictions (the product's path: the knee on the model's dense curve) against the
oracle, `policy.choose` on the candidate table with the measurements put in place of the
predictions. Regret = (measured metric of the model's choice - the oracle's) / the oracle's;
the metric is the objective's (training time; cost; training time for the knee, where it is
signed: a knee is not a minimum, so a choice can train faster than the oracle's knee).
Search cost: the profile rows do not record each trial's wall time, so the partial search's
cost is measured by running one (full run only). Paper goal: partial / full <= 0.25.
Writes prediction.{json,md}, and per workload prediction_<workload>.png and the full
search's plan, prediction_<workload>.plan.json (`tula_ray.Plan.from_json`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import (RESULTS_DIR, cross_search_errors, provenance,
                               relative_errors, spread, write_result)
from tula_ray.pricing import (USD_PER_GB_HOUR_DEFAULT, USD_PER_NODE_HOUR_DEFAULT, FixedRate,
                              MemoryRate)

NAME = "prediction"
SEARCH = dict(cluster_sizes=(1, 2), min_batch=32)  # the demo's grid (NOTES-ENV: 2 cores)
# Workload -> its search's max_batch and train_subset. train_subset keeps data loading and
# D of eq. 4a small; step times do not depend on it. resnet18 stops at B = 1024 (a ~2 s
# step on N = 1 here); the CNN goes to the demo's 2048.
WORKLOADS = {"fashion-mnist-cnn": {"max_batch": 2048, "train_subset": 10000},
             "resnet18-fashion-mnist": {"max_batch": 1024, "train_subset": 10000}}
QUICK_WORKLOADS = {"fashion-mnist-cnn": {"max_batch": 64, "train_subset": 2048}}
OBJECTIVES = ("time", "cost", "knee")
PRICINGS = {f"fixed ${USD_PER_NODE_HOUR_DEFAULT}/node-h": FixedRate(USD_PER_NODE_HOUR_DEFAULT),
            f"memory ${USD_PER_GB_HOUR_DEFAULT}/GB-h": MemoryRate(USD_PER_GB_HOUR_DEFAULT)}
MODELS = ("full", "partial")
GOAL_COST_RATIO = 0.25  # partial / full profiling wall time
# Of a search's Plan.meta; "trials" are worker-group launches (one per N and round).
WALL_KEYS = ("trials", "probe_wall_s", "profiling_wall_s")


def replan(full_plan, strategy: str, objective: str, pricing):
    """The plan a `strategy` search would make from `full_plan`'s profiles (partial: only the
    corner rows are fitted), for this objective and pricing, through `build_plan`."""
    from tula_ray.plan import build_plan
    from tula_ray.space import SearchSpace

    table = full_plan.table
    space = SearchSpace(tuple(sorted(table["num_workers"].unique().tolist())),
                        tuple(sorted(table["global_batch"].unique().tolist())))
    return build_plan(space, full_plan.profiles, epochs=full_plan.epochs,
                      dataset_size=full_plan.dataset_size, strategy=strategy,
                      objective=objective,
                      pricing=pricing, memory=full_plan.memory,
                      max_local_batch=full_plan.meta.get("max_local_batch"),
                      collective=full_plan.perf.collective, workload=full_plan.workload)


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


def _selection(full_plan) -> list[dict]:
    from tula_ray.policy import choose

    rows = []
    for label, pricing in PRICINGS.items():
        oracle_table = measured_table(full_plan.table, pricing)
        indexed = oracle_table.set_index(["num_workers", "global_batch"])
        for objective in OBJECTIVES:
            metric = "cost_usd" if objective == "cost" else "total_time_s"
            picks = {"oracle": choose(oracle_table, objective)}
            picks.update({m: replan(full_plan, m, objective, pricing).choice for m in MODELS})
            row = {"objective": objective, "pricing": label, "metric": metric}
            for who, choice in picks.items():
                measured = float(indexed.loc[(choice.num_workers, choice.global_batch), metric])
                row[who] = {"num_workers": choice.num_workers, "global_batch": choice.global_batch,
                            "measured": measured, "knee_global_batch": choice.knee_global_batch}
            best = row["oracle"]["measured"]
            for m in MODELS:
                row[f"{m}_regret"] = (row[m]["measured"] - best) / best
            rows.append(row)
    return rows


def _accuracy(full_plan) -> tuple[pd.DataFrame, dict]:
    """Per-candidate predictions of both models against the measurements, and a summary."""
    from tula_ray.search_strategies import make_strategy

    partial = replan(full_plan, "partial", full_plan.objective, "fixed")
    table = full_plan.table.merge(
        partial.table[["num_workers", "global_batch", "step_time_s", "total_time_s"]],
        on=["num_workers", "global_batch"], suffixes=("_full", "_partial"))
    table = table[table["measured_step_time_s"].notna()].reset_index(drop=True)
    corner_rows = make_strategy("partial").fit_rows(full_plan.profiles)
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


def _one_workload(name: str, settings: dict, quick: bool, scratch: Path, full=None) -> dict:
    import tula_ray

    options = dict(**SEARCH, max_batch=settings["max_batch"],
                   workload_options={"train_subset": settings["train_subset"]})
    if full is None:
        full = tula_ray.search(name, strategy="full", storage_path=str(scratch / f"{name}-full"),
                               **options)
    suffix = "_quick" if quick else ""
    # The full search's plan (profiles, fits, measurements): selection and fits can be
    # re-analysed from it without profiling again.
    plan_json = f"{NAME}_{name}{suffix}.plan.json"
    full.to_json(RESULTS_DIR / plan_json)
    table, accuracy = _accuracy(full)
    cost = {"full": {k: full.meta[k] for k in WALL_KEYS},
            "partial": None, "partial_over_full": None, "goal": GOAL_COST_RATIO}
    if not quick:
        partial = tula_ray.search(name, strategy="partial",
                                  storage_path=str(scratch / f"{name}-partial"), **options)
        _, errors = cross_search_errors(partial, full)
        cost["partial"] = {**{k: partial.meta[k] for k in WALL_KEYS},
                           "vs_full_measured_median_rel_error": float(np.median(errors)),
                           "vs_full_measured_spread": spread(errors)}
        cost["partial_over_full"] = partial.meta["profiling_wall_s"] / full.meta["profiling_wall_s"]
    plot = f"{NAME}_{name}{suffix}.png"
    _plot(full, table, RESULTS_DIR / plot)
    columns = ["num_workers", "global_batch", "local_batch", "corner", "measured_step_time_s",
               "step_time_s_full", "step_time_s_partial", "measured_total_time_s",
               "total_time_s_full", "total_time_s_partial", "full_rel_error", "partial_rel_error"]
    return {"workload": name, "options": {**settings, **SEARCH}, "epochs": full.epochs,
            "dataset_size": full.dataset_size, "max_local_batch": full.meta.get("max_local_batch"),
            "batch_sizes": sorted(full.table["global_batch"].unique().tolist()),
            "per_candidate": table[columns].to_dict("records"), "accuracy": accuracy,
            "selection": _selection(full), "search_cost": cost, "plot": plot,
            "plan_json": plan_json}


def run(quick: bool = False, full_plans: dict | None = None) -> dict:
    """full_plans: {workload: Plan of a full search} to analyse instead of searching again
    (quick only: the test suite hands in the full search its own tests already ran)."""
    if full_plans and not quick:
        raise ValueError("full_plans is for quick runs only; a full run measures its own grid")
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
    result = {**provenance(), "quick": quick, "workloads": results,
              "load_avg_1min": [load_before, os.getloadavg()[0]]}
    markdown = _markdown(result)
    write_result(NAME + ("_quick" if quick else ""), result, markdown)
    print(markdown)
    return result


def _plot(full_plan, table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.6, 4.4))
    for n, rows in table.sort_values("global_batch").groupby("num_workers"):
        line, = axis.plot(rows["global_batch"], rows["measured_total_time_s"], "o",
                          label=f"N={n} measured")
        for m, style in (("full", "-"), ("partial", "--")):
            axis.plot(rows["global_batch"], rows[f"total_time_s_{m}"], style,
                      color=line.get_color(), lw=1, label=f"N={n} {m} model")
    axis.set_xscale("log", base=2)
    axis.set(yscale="log", xlabel="global batch size B",
             ylabel=f"training time (s), E={full_plan.epochs}, D={full_plan.dataset_size}",
             title=f"{full_plan.workload}: measured vs predicted (eq. 2, 4a)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _pick(p: dict, metric: str) -> str:
    value = f"${p['measured']:.4g}" if metric == "cost_usd" else f"{p['measured']:.4g} s"
    return f"N={p['num_workers']}, B={p['global_batch']}: {value}"


def _workload_markdown(w: dict) -> str:
    a, cost = w["accuracy"], w["search_cost"]
    rows = "\n".join(
        f"| {c['num_workers']} | {c['global_batch']}{' (corner)' if c['corner'] else ''} | "
        f"{c['measured_step_time_s'] * 1e3:.1f} | {c['step_time_s_full'] * 1e3:.1f} | "
        f"{c['step_time_s_partial'] * 1e3:.1f} | {c['measured_total_time_s']:.1f} | "
        f"{c['total_time_s_full']:.1f} | {c['total_time_s_partial']:.1f} | "
        f"{c['full_rel_error']:.1%} | {c['partial_rel_error']:.1%} |" for c in w["per_candidate"])
    selection = "\n".join(
        f"| {s['objective']} | {s['pricing']} | {_pick(s['oracle'], s['metric'])} | "
        f"{_pick(s['partial'], s['metric'])} | {s['partial_regret']:+.1%} | "
        f"{_pick(s['full'], s['metric'])} | {s['full_regret']:+.1%} |" for s in w["selection"])
    partial = cost["partial"]
    cost_rows = (
        f"| partial search (separate run): trials / profiling wall time | "
        f"{partial['trials']} / {partial['profiling_wall_s']:.0f} s |\n"
        f"| profiling cost partial / full (goal <= {cost['goal']}) | "
        f"{cost['partial_over_full']:.2f} |\n"
        f"| that search's predictions vs this grid's measured step times (model error + run-to-run "
        f"noise): median [min, max] | {partial['vs_full_measured_spread']} |"
        if partial else
        "| partial search | not run (quick); the profile rows record no per-trial wall time |")
    full = cost["full"]
    return f"""#### {w['workload']}

train_subset {w['options']['train_subset']} (D = {w['dataset_size']}, E = {w['epochs']} epochs),
N in {list(w['options']['cluster_sizes'])}, B in {w['batch_sizes']} (max local batch from the
memory probe: {w['max_local_batch']}).
![training time vs B, {w['workload']}](benchmarks/results/{w['plot']})

| step / training-time error (eq. 2, 4a) | full model | partial model (corners only) |
|---|---|---|
| median [min, max] over every candidate | {a['full']['spread']} | {a['partial']['spread']} |
| max | {a['full']['max_rel_error']:.1%} | {a['partial']['max_rel_error']:.1%} |
| median off the partial model's corners (out of sample) | - | {_pct(a['partial']['median_rel_error_off_corners'])} |
| leave-one-out error of the fit (median) | {_pct(a['full']['loo_median_rel_error'])} | {_pct(a['partial']['loo_median_rel_error'])} |
| profiles fitted / form | {a['full']['num_profiles']} / {a['full']['form']} | {a['partial']['num_profiles']} / {a['partial']['form']} |

| N | B | measured step (ms) | full step (ms) | partial step (ms) | measured T (s) | full T (s) | partial T (s) | full error | partial error |
|---|---|---|---|---|---|---|---|---|---|
{rows}

| objective | pricing | oracle: measured grid | partial model's choice: measured | partial regret | full model's choice: measured | full regret |
|---|---|---|---|---|---|---|
{selection}

| search cost | value |
|---|---|
| full search: trials / probe / profiling wall time | {full['trials']} / {full['probe_wall_s']:.0f} s / {full['profiling_wall_s']:.0f} s |
{cost_rows}
"""


def _markdown(r: dict) -> str:
    load = r["load_avg_1min"]
    sections = "\n".join(_workload_markdown(w) for w in r["workloads"].values())
    return f"""### Performance-model accuracy and selection quality (issue 5; paper Fig. 9, 11b, §IV-C)

`{r['command']}` — commit {r['commit']}, {r['date']}, {r['machine']}; 1-min load average
{load[0]:.1f} before, {load[1]:.1f} after (a shared machine: wall times depend on it).

One full search per workload measures every candidate (the ground truth). The full model
is fitted on all of them; the partial model on the same search's corner rows only (min/max
N x min/max B), so both see the same measurements and the gap between them is model error,
not the ~15 % (up to ~50 %) run-to-run noise of step times between processes here
(NOTES-ENV); the per-trial spread is not recorded in the profiles. Relative errors of step
time and of training time (eq. 4a, T = E ceil(D/B) t_step) are the same number. Choices:
each model's plan (`build_plan`; the knee on its dense predicted curve) against the oracle,
`policy.choose` on the measured grid. Regret = (measured metric of the choice - oracle's) /
oracle's; the metric is training time (time, knee) or cost; for the knee it is signed (a
knee is not a minimum). Time and knee do not depend on the pricing.

{sections}"""
