"""The train-time benchmark's comparisons (`benchmarks.prediction.train_time`): each plan's epoch
against `train`'s measured epochs, cell by cell, and the figures the goals name."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

BF16_OF = {"fashion-mnist-cnn-bf16": "fashion-mnist-cnn"}  # a bf16 label: its fp32 one


def profiled(plan) -> list[tuple[int, int]]:
    rows = plan.table[plan.table["estimate"] == "measured"]
    return sorted(zip(rows["num_workers"].astype(int), rows["global_batch"].astype(int)))


def _row(plan, num_workers: int, global_batch: int):
    table = plan.table
    return table[(table["num_workers"] == num_workers)
                 & (table["global_batch"] == global_batch)].iloc[0]


def _predicted(row) -> float:
    """A plan row's epoch as the runs are compared with it: the measured row's own steps
    where profiled, else the model's fit."""
    measured = float(row.get("measured_epoch_time_s", np.nan))
    return measured if np.isfinite(measured) else float(row["epoch_time_s"])


def _in_grid(row: dict) -> bool:
    """A row of the goal's fp32 grid: neither a demo's choice nor a bf16 cell."""
    return not row["workload"].startswith("demo") and row["workload"] not in BF16_OF


def compare(plans: dict, demos: list, runs: list[dict]) -> list[dict[str, Any]]:
    rows = []
    named_demos = [(f"demo{i}", demo) for i, demo in enumerate(demos)]
    for workload, plan in [*plans.items(), *named_demos]:
        for n, b in profiled(plan) if not workload.startswith("demo") else [
                (plan.choice.num_workers, plan.choice.global_batch)]:
            mine = [r for r in runs if r["workload"] == workload and r["num_workers"] == n
                    and r["global_batch"] == b]
            if not mine:
                continue
            per_run = [statistics.median(r["epoch_seconds"][1:]) for r in mine]
            measured = statistics.median(per_run)
            row = _row(plan, n, b)
            predicted = _predicted(row)
            evals = [statistics.median(r["eval_seconds"][1:]) for r in mine]
            rows.append({**_whole_call(row, predicted, mine, plan.profiles),
                         "workload": workload, "num_workers": n, "global_batch": b,
                         "predicted_s": predicted, "model_s": float(row["epoch_time_s"]),
                         "measured_s": measured, "ratio": predicted / measured,
                         "repeat_spread": (max(per_run) - min(per_run)) / measured,
                         "eval_predicted_s": float(row.get("eval_time_s", np.nan)),
                         "eval_measured_s": statistics.median(evals),
                         "repeats": len(per_run)})
    return rows


def _whole_call(row, epoch_s: float, runs: list[dict], plan_profiles) -> dict[str, float]:
    """The plan's `total_time_s` for the runs' epochs (start-up + epochs x (epoch +
    evaluation + checkpoint), the epoch as compared above) against the median of the
    runs' whole `train` call; {} where the runs did not record the call (before
    2026-11-27)."""
    walls = [r["wall_s"] for r in runs if "wall_s" in r]
    if not walls:
        return {}
    epochs = len(runs[0]["epoch_seconds"])
    startup = float(row.get("startup_time_s", 0.0))
    # What the start-up was before 2026-11-27: the launch's start and data load only.
    launches = plan_profiles[plan_profiles["num_workers"] == row["num_workers"]]
    before = float((launches["launch_wall_s"] + launches["data_load_s"].fillna(0.0)).median())
    total = startup + epochs * (epoch_s + float(row.get("eval_time_s", 0.0))
                                + float(row.get("checkpoint_time_s", 0.0)))
    return {"call_predicted_s": total, "call_measured_s": statistics.median(walls),
            "call_epochs": epochs, "startup_predicted_s": startup,
            "startup_before_s": before,
            # What the call spent outside its epochs' training and evaluation.
            "outside_epochs_s": statistics.median(
                r["wall_s"] - sum(r["epoch_seconds"]) - sum(r["eval_seconds"])
                for r in runs if "wall_s" in r)}


def summary(rows: list[dict]) -> dict[str, Any]:
    """The goal's figures over the fp32 grid (as before bf16 joined it), bf16's beside."""
    grid = [abs(r["ratio"] - 1) for r in rows if _in_grid(r)]
    bf16 = [abs(r["ratio"] - 1) for r in rows if r["workload"] in BF16_OF]
    demo = [abs(r["ratio"] - 1) for r in rows if r["workload"].startswith("demo")]
    calls = [abs(r["call_predicted_s"] / r["call_measured_s"] - 1) for r in rows
             if "call_measured_s" in r]
    return {"call_abs_errors": calls,
            "median_abs_error": float(np.median(grid)) if grid else None,
            "worst_abs_error": float(np.max(grid)) if grid else None,
            "bf16_abs_errors": bf16,
            "demo_abs_error": float(np.median(demo)) if demo else None,
            "demo_abs_errors": demo}


def precision_ratios(rows: list[dict]) -> list[dict[str, Any]]:
    """bf16's epoch over fp32's at the same (N, B): as the plans predict it and as `train`
    measured it (runs of one day, not interleaved across precisions)."""
    by_key = {(r["workload"], r["num_workers"], r["global_batch"]): r for r in rows}
    ratios = []
    for (label, n, b), row in by_key.items():
        fp32 = by_key.get((BF16_OF.get(label), n, b))
        if fp32 is not None:
            ratios.append({"num_workers": n, "global_batch": b,
                           "predicted": row["predicted_s"] / fp32["predicted_s"],
                           "measured": row["measured_s"] / fp32["measured_s"]})
    return ratios


def each_search(searches: list[dict], runs: list[dict]) -> list[dict[str, Any]]:
    """Per search (repeat r's plans): the goal's figures of its plans against the median of
    every run (`all_runs`) and against the runs of repeat r only, which followed it
    (`its_runs`: one run a cell, so the runs' own noise is in them)."""
    figures = []
    for repeat, plans in enumerate(searches):
        mine = [r for r in runs if r.get("repeat") == repeat
                and not r["workload"].startswith("demo")]
        figures.append({"repeat": repeat,
                        "all_runs": summary(compare(plans, [], runs)),
                        "its_runs": summary(compare(plans, [], mine)) if mine else None})
    return figures


def add_plan_spread(rows: list[dict], searches: list[dict]) -> None:
    """Each grid row gains every search's prediction of its cell (`plans_predicted_s`),
    their spread ((max - min) / median) and the median plan's ratio to the runs."""
    for row in rows:
        predicted = [_predicted(_row(plans[row["workload"]], row["num_workers"],
                                     row["global_batch"]))
                     for plans in searches if row["workload"] in plans]
        predicted = [p for p in predicted if np.isfinite(p)]
        if len(predicted) < 2:
            continue
        middle = statistics.median(predicted)
        row.update(plans_predicted_s=predicted,
                   plans_spread=(max(predicted) - min(predicted)) / middle,
                   median_plan_ratio=middle / row["measured_s"])


def median_plan_errors(rows: list[dict]) -> dict[str, Any] | None:
    """The goal's figures for the median of the searches' plans (fp32 grid)."""
    grid = [abs(r["median_plan_ratio"] - 1) for r in rows
            if "median_plan_ratio" in r and _in_grid(r)]
    if not grid:
        return None
    return {"median_abs_error": float(np.median(grid)), "worst_abs_error": float(np.max(grid))}
