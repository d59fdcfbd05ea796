"""The plan's evaluation pass at each candidate's local batch, against `train`'s: priced by
the compute cost per sample (`tula_ray.planning.estimates.evaluation_by_batch`), or the
pass as profiled at every b (the plans before `PlanContext.eval_at_local_batch`).

No new run: it reads what `python -m benchmarks train-time` recorded. For every cell of
its grid (the fp32 workloads, the bf16 one and the demo's choices), `train`'s evaluation
pass (its recorded median, `eval_measured_s`) against the first search's saved plan
(results/train_time_<label>.plan.json, demoN's own): the plan's profiled pass priced at
the cell's b from that plan's profiles and fit, and the same pass as profiled, at every b
(what plans before the context's flag counted; the recorded `eval plan s` of those).
The figures: median and worst |plan / train - 1| of each. `train` evaluates at the local
batch there (none of the workloads sets `eval_batch`). `--quick` reads the same records
and keeps the first 4 cells.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, Benchmark, markdown_table
from benchmarks.prediction.train_time import NAME as SOURCE, plan_path

NAME = "eval_pricing"
QUICK_CELLS = 4


def pass_s(plan, num_workers: int, global_batch: int, priced: bool) -> float:
    """The plan's profiled evaluation pass at the cell: priced at its local batch by the
    fit's compute cost per sample, or as profiled (`evaluation_by_batch`), whichever way
    the plan itself counted it."""
    from tula_ray.planning.estimates import compute_per_sample, evaluation_by_batch

    at = evaluation_by_batch(plan.profiles, compute_per_sample(plan.perf) if priced else None)
    if at is None:
        return math.nan
    local = np.array([global_batch / num_workers])
    return float(at(np.array([float(num_workers)]), local)[0])


def cells(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    """Every recorded cell with a measured pass: train's, the plan's as recorded, priced."""
    from tula_ray.planning.plan import Plan

    plans: dict[str, Any] = {}
    found = []
    for row in recorded["rows"]:
        label, n, b = row["workload"], int(row["num_workers"]), int(row["global_batch"])
        if not math.isfinite(row.get("eval_measured_s", math.nan)):
            continue
        if label not in plans:
            plans[label] = Plan.from_json(plan_path(SOURCE, label))
        plan = plans[label]
        found.append({"workload": label, "num_workers": n, "global_batch": b,
                      "train_s": row["eval_measured_s"],
                      "as_profiled_s": pass_s(plan, n, b, priced=False),
                      "priced_s": pass_s(plan, n, b, priced=True)})
    return found


def _errors(rows: list[dict], key: str) -> list[float]:
    return [abs(r[key] / r["train_s"] - 1) for r in rows if math.isfinite(r[key])]


def run(quick: bool = False) -> dict:
    import json

    recorded = json.loads((RESULTS_DIR / f"{SOURCE}.json").read_text())
    found = cells(recorded)[:QUICK_CELLS] if quick else cells(recorded)
    summary = {key: {"median": statistics.median(errors), "worst": max(errors)}
               for key in ("as_profiled_s", "priced_s") if (errors := _errors(found, key))}
    source = recorded["provenance"]
    return Benchmark(NAME, quick).record(
        {"source": {"benchmark": SOURCE, "commit": source["commit"], "date": source["date"]},
         "cells": found, "summary": summary}, report)


def report(result: dict[str, Any]) -> str:
    source, summary = result["source"], result["summary"]
    body = [[c["workload"], c["num_workers"], c["global_batch"], f"{c['train_s']:.2f}",
             f"{c['as_profiled_s']:.2f}", f"{c['priced_s']:.2f}"] for c in result["cells"]]
    lines = ["### The evaluation pass at each local batch: priced by the compute cost per "
             "sample (issue 43)\n",
             f"`{result['command']}` at {result['commit']}, {result['date']}, "
             f"{result['machine']}.\n",
             f"No new run: `train`'s evaluation pass in the cells that `{source['benchmark']}` "
             f"recorded at {source['commit']} ({source['date']}), against each cell's first "
             "search's plan. That plan's profiled pass is either taken as measured at every b, "
             "or priced at the cell's b by the fit's compute cost per sample (eq. 2b). "
             "`train` evaluates at the training's local batch there.\n",
             markdown_table(["workload", "N", "B", "train s", "plan s, as profiled",
                             "plan s, priced at b"], body), ""]
    for key, label in (("as_profiled_s", "as profiled"), ("priced_s", "priced at b")):
        if key in summary:
            lines.append(f"- {label}: median |plan / train - 1| = "
                         f"{summary[key]['median']:.1%}, worst {summary[key]['worst']:.1%} "
                         f"over {len(_errors(result['cells'], key))} cells.")
    return "\n".join(lines) + "\n"
