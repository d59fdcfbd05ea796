"""The adaptive-batch benchmark's run records read (`benchmarks.accuracy.adaptive_batch`):
when a run reached a target, its steps at each B, its speed, the arms' runs, and what a
protocol version records. Pure functions of the records; `adaptive_batch_report` judges
and reports from them.

A run record (one line of results/adaptive_batch.runs.jsonl): workload, batch (an int, or
"adaptive"), seed, evaluations (train's rows: steps, samples, seconds, val_accuracy, and
global_batch where the run records it), eval_seconds_each, test_accuracy, wall_s, notes.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

ADAPTIVE = "adaptive"
UNREACHED = {"seconds": math.inf, "train_seconds": math.inf, "samples": math.inf,
             "steps": math.inf}


def evaluations_to(run: dict[str, Any], target: float) -> list[dict[str, Any]]:
    """`run`'s evaluations up to the first at or above `target` ([] when none is)."""
    for count, row in enumerate(run["evaluations"], start=1):
        if row["val_accuracy"] >= target:
            return run["evaluations"][:count]
    return []


def time_to_target(run: dict[str, Any], target: float) -> dict[str, float]:
    """The first evaluation of `run` at or above `target`: its seconds (train's clock),
    train_seconds (those less the evaluations so far, each the run's mean), samples and
    steps; inf throughout when none is."""
    evaluations = evaluations_to(run, target)
    if not evaluations:
        return dict(UNREACHED)
    row = evaluations[-1]
    return {"seconds": row["seconds"],
            "train_seconds": row["seconds"] - len(evaluations) * run["eval_seconds_each"],
            "samples": row["samples"], "steps": row["steps"]}


def steps_by_batch(run: dict[str, Any], target: float) -> dict[int, float]:
    """The steps `run` trained at each B until it reached `target` (unreached: inf at its
    batch). A fixed run: its one B. The adaptive run: each interval's steps at the batch
    its closing evaluation records; {} when its evaluations record none."""
    reached = time_to_target(run, target)["steps"]
    if run["batch"] != ADAPTIVE:
        return {int(run["batch"]): reached}
    rows = run["evaluations"]
    if math.isinf(reached) or not rows or any("global_batch" not in r for r in rows):
        return {}
    steps: dict[int, float] = {}
    before = 0
    for row in rows:
        batch = int(row["global_batch"])
        steps[batch] = steps.get(batch, 0) + row["steps"] - before
        before = row["steps"]
        if row["steps"] >= reached:
            break
    return steps


def arm_runs(runs: list[dict], workload: str, batch: int | str, seeds) -> list[dict]:
    return [r for r in runs if r["workload"] == workload and r["batch"] == batch
            and r["seed"] in seeds]


def arm_times(runs: list[dict], target: float, measure: str) -> list[float]:
    return [time_to_target(r, target)[measure] for r in runs]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def step_ms(run: dict[str, Any]) -> float:
    """The run's mean milliseconds per optimizer step, evaluations left out: how fast the
    machine ran it (version 2's report shows it per arm)."""
    rows = run["evaluations"]
    if not rows or not rows[-1]["steps"]:
        return math.nan
    last = rows[-1]
    return 1000 * (last["seconds"] - len(rows) * run["eval_seconds_each"]) / last["steps"]


def shows_speed(result: dict[str, Any]) -> bool:
    """Version 2 on shows each arm's milliseconds per step."""
    return result["protocol"]["version"] >= 2


def judges_training_part(result: dict[str, Any]) -> bool:
    """Whether the plan's adaptive row is judged by its training part (version 2's
    `plan_row_measure`), not by its whole time (version 1)."""
    return result["protocol"].get("plan_row_measure") == "training"
