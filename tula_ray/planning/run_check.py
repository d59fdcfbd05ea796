"""The plan's figures for a run of its choice, beside what the run measured (issue 43: the
step time `train` really takes, and its evaluations): every `train` run of a fixed batch
says how far the plan it trained was from it, per step and per epoch's evaluation, so a
user sees what a plan's times are worth on their cluster. Core module: no Ray.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import pandas as pd

from tula_ray.planning.target_costs import TargetEvaluations


@dataclass(frozen=True)
class Planned:
    """What the plan predicts for a run at its (N, B): one training step (data path and
    strategy included: the epoch's time over its steps) and an epoch's evaluation as the
    run evaluates (a test pass per epoch, or a run to a target's validation passes,
    `planning.target_costs`; NaN where the plan did not measure it)."""

    step_s: float
    evaluation_s: float
    to_target: bool


def planned_for_run(plan, num_workers: int, global_batch: int, to_target: bool
                    ) -> Planned | None:
    """The plan's `Planned` at (N, B): its measured epoch where it profiled the candidate,
    else its prediction; None when the plan has no row there."""
    table = plan.table
    rows = table[(table["num_workers"] == num_workers) & (table["global_batch"] == global_batch)]
    if rows.empty:
        return None
    row = rows.iloc[0]
    measured = row.get("source") == "measured" and math.isfinite(
        float(row.get("measured_epoch_time_s", math.nan)))
    epoch = float(row["measured_epoch_time_s"] if measured else row["epoch_time_s"])
    step_s = epoch / (plan.dataset_size // global_batch)
    profiled = plan.profiles
    measured_pass = "eval_time_s" in profiled and profiled["eval_time_s"].notna().any()
    evaluation = float(row["eval_time_s"]) if measured_pass else math.nan
    if to_target:
        target = TargetEvaluations.from_profiles(plan.profiles, plan.dataset_size)
        evaluation = math.nan if target is None else float(
            target.per_run_epoch(target.validation_s(evaluation, global_batch)))
    return Planned(step_s, evaluation, to_target)


def against_plan(planned: Planned, metrics: pd.DataFrame) -> pd.DataFrame:
    """The run's epochs after its first (warm-up) against the plan, medians over them:
    its training seconds per epoch (`seconds`, at its own steps) and its evaluation's
    (`val_seconds` of a run to a target, else `eval_seconds`; where the plan measured an
    evaluation pass). Columns: what, planned,
    measured, ratio (planned / measured). Whole epochs only: a run that stopped at its
    target part-way through its last one leaves that one out; with a single epoch, it."""
    whole = metrics[metrics["steps"] == metrics["steps"].max()]
    later = whole.iloc[1:] if len(whole) > 1 else whole
    steps = float(later["steps"].median())
    column = "val_seconds" if planned.to_target else "eval_seconds"
    rows = [("training s per epoch", planned.step_s * steps,
             statistics.median(later["seconds"].astype(float)))]
    if math.isfinite(planned.evaluation_s) and column in later and later[column].notna().any():
        rows.append(("evaluation s per epoch", planned.evaluation_s,
                     statistics.median(later[column].dropna().astype(float))))
    frame = pd.DataFrame(rows, columns=["what", "planned", "measured"])
    frame["ratio"] = frame["planned"] / frame["measured"]
    return frame


def against_plan_line(frame: pd.DataFrame) -> str:
    """`against_plan`'s rows, for a person."""
    if frame.empty:
        return "against the plan: nothing to compare"
    parts = [f"{row.what} {row.measured:.3g}, planned {row.planned:.3g} ({row.ratio:.2f}x)"
             for row in frame.itertuples()]
    return "against the plan (epochs after the first, median): " + "; ".join(parts)
