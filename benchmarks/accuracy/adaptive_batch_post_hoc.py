"""The adaptive-batch reports' readings added after the runs, which no goal reads: the plan
row's parts that the protocol's time leaves out, the plan's step time beside the runs',
each adaptive run before its first switch beside its fixed twin, and each switch with
the phi and goodput that chose it. Pure functions of the recorded result.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.accuracy.adaptive_batch_runs import (ADAPTIVE, arm_runs, arm_times,
                                                     judges_training_part, median, shows_speed,
                                                     step_ms)
from benchmarks.common import markdown_table
from benchmarks.common.bootstrap import ratio

def like_for_like_lines(result: dict[str, Any], workload: dict[str, Any],
                   judged: dict[float, dict]) -> list[str]:
    """The part of the plan's adaptive row the goal does not judge, against the adaptive
    runs' median. Version 1 judged the whole row: its training part alone, read post hoc.
    Version 2 judges the training part: the whole row (start-up and evaluations
    included), reported beside, not judged."""
    training_part = judges_training_part(result)
    planned = result["workloads"][workload["name"]].get(
        "plan_adaptive_s" if training_part else "plan_adaptive_train_s")
    if not planned:
        return []
    parts = []
    for target in workload["targets"]:
        plan_s = planned.get(str(target))
        measured = median(judged[target]["times"].get("adaptive", []))
        if plan_s is not None and math.isfinite(measured):
            parts.append(f"{target:.0%}: {plan_s:.3g} s against {measured:.3g} s "
                         f"({plan_s / measured - 1:+.0%})")
    if not parts:
        return []
    if training_part:
        return ["- Not judged: the plan's adaptive row's whole time, start-up and its "
                "epochs' evaluations included, which the protocol's time leaves out, against "
                "the adaptive runs' median: " + "; ".join(parts) + ".",
                *_whole_call_line(result, workload, planned), ""]
    return ["- Post hoc, after the runs (not a goal's verdict): the plan's adaptive row "
            "counts the run's start-up and each epoch's evaluation, which the protocol's "
            "time leaves out; its training part alone against the adaptive runs' median: "
            + "; ".join(parts) + ".", ""]


def _whole_call_line(result: dict[str, Any], workload: dict[str, Any],
                     planned: dict[str, float]) -> list[str]:
    """Added after version 4's runs: the whole row at the late target, where every run
    stops, against the adaptive runs' wall (the whole `train` call, Ray already up: its
    start-up, its evaluations every `eval_every_samples` and its test pass included)."""
    late = max(workload["targets"])
    runs = arm_runs(result["runs"], workload["name"], ADAPTIVE,
                    result["protocol"]["scoring_seeds"])
    walls = [r["wall_s"] for r in runs if "wall_s" in r]
    plan_s = planned.get(str(late))
    if plan_s is None or not walls:
        return []
    wall = median(walls)
    return [f"- Added after the runs (not judged): the whole row at {late:.0%}, where every "
            f"run stops, against the adaptive runs' median wall (the whole `train` call, Ray "
            f"already up): {plan_s:.3g} s against {wall:.3g} s ({plan_s / wall - 1:+.0%})."]


def plan_speed_lines(result: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    """The plan's milliseconds per step at each fixed B against the fixed runs' (every
    seed), and the batches its adaptive row trains per target: where the plan row's error
    comes from. Added after version 3's runs; no goal reads it."""
    arms = result["workloads"][workload["name"]]
    planned = arms.get("plan_step_ms")
    if not planned:
        return []
    protocol = result["protocol"]
    seeds = [*protocol["selection_seeds"], *protocol["scoring_seeds"]]
    parts = []
    for batch, plan_ms in planned.items():
        runs_ms = median([step_ms(r) for r in arm_runs(result["runs"], workload["name"],
                                                       int(batch), seeds)])
        if math.isfinite(runs_ms):
            parts.append(f"B = {batch}: {plan_ms:.3g} against {runs_ms:.3g} "
                         f"({plan_ms / runs_ms:.2f}x)")
    schedules = "; ".join(f"{float(t):.0%}: {b}" for t, b in
                          arms.get("plan_adaptive_batches", {}).items() if b)
    return ["- Added after the runs, to read the plan row's error (no goal reads it): the "
            "plan's ms per step, which its fixed rows and its adaptive row count, against "
            "the fixed runs' median ms/step (every seed): " + "; ".join(parts) + ". The "
            f"plan's adaptive row trains at {schedules}.", ""]


def start_overhead(runs: list[dict], workload: str, seeds) -> list[dict[str, Any]]:
    """Each adaptive run before its first switch against the fixed run of its start batch
    on the same seed: the same steps (`same_accuracy` says whether every evaluation's
    validation accuracy is equal until then), so the ratio of their training seconds is
    what training adaptively costs at one batch. Added after version 2's runs."""
    rows = []
    for run in arm_runs(runs, workload, ADAPTIVE, seeds):
        evaluations = run["evaluations"]
        if not evaluations or "global_batch" not in evaluations[0]:
            continue
        start = int(evaluations[0]["global_batch"])
        count = next((i for i, e in enumerate(evaluations) if int(e["global_batch"]) != start),
                     len(evaluations))
        fixed = arm_runs(runs, workload, start, [run["seed"]])
        if not fixed or len(fixed[0]["evaluations"]) < count:
            continue
        mine, theirs = evaluations[count - 1], fixed[0]["evaluations"][count - 1]
        adaptive_s = mine["seconds"] - count * run["eval_seconds_each"]
        fixed_s = theirs["seconds"] - count * fixed[0]["eval_seconds_each"]
        rows.append({"seed": run["seed"], "batch": start, "steps": mine["steps"],
                     "same_accuracy": all(a["val_accuracy"] == f["val_accuracy"] for a, f in
                                          zip(evaluations[:count], fixed[0]["evaluations"])),
                     "adaptive_s": adaptive_s, "fixed_s": fixed_s,
                     "ratio": ratio(adaptive_s, fixed_s)})
    return rows


def overhead_lines(result: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    if not shows_speed(result):
        return []
    found = start_overhead(result["runs"], workload["name"],
                           result["protocol"]["scoring_seeds"])
    if not found:
        return []
    body = [[r["seed"], r["batch"], r["steps"], "yes" if r["same_accuracy"] else "**no**",
             f"{r['adaptive_s']:.3g}", f"{r['fixed_s']:.3g}", f"{r['ratio']:.2f}"]
            for r in found]
    return ["Added after the runs: each adaptive run before its first switch, against the "
            "fixed run of its start batch on the same seed (the same steps: equal validation "
            "accuracies until then). Training seconds to its last evaluation at that batch:\n",
            markdown_table(["seed", "B", "steps", "same accuracies", "adaptive s", "fixed s",
                            "adaptive / fixed"], body), ""]


def switch_lines(switches: list[dict] | None) -> list[str]:
    """The adaptive runs' changes of B, each with the phi and goodput that chose it."""
    if switches is None:  # a result recorded before the switches were explained
        return []
    if not switches:
        return ["The adaptive runs (scoring seeds) never changed B.\n"]
    body = [[s["seed"], s["samples"], f"{s['val_accuracy']:.1%}", f"{s['noise_scale']:.4g}",
             f"{s['from']} -> {s['to']}", f"{s['gain']:+.1%}", s["best"],
             "yes" if s["reproduced"] else "**no**"] for s in switches]
    return ["Each change of B in the adaptive runs (scoring seeds), at the evaluation that "
            "decided it: the online phi recorded there, and the goodput of the new B over "
            "the old one recomputed from the plan's options; `same` says whether the "
            "hysteresis rule (switch at +5 % or more) chooses that B again.\n",
            markdown_table(["seed", "samples", "val acc", "phi", "B", "goodput gain",
                            "best B", "same"], body), ""]


def reach_lines(result: dict[str, Any], workload: dict[str, Any],
                judged: dict[float, dict]) -> list[str]:
    """What any schedule of the plan's batches could gain at the late target, from the
    fixed runs alone: the best fixed B, and the best two-phase schedule (B1 until the early
    target, then B2's own time from the early to the late target), over the static choice,
    medians over the selection seeds (every B ran there). The second phase starts from
    where B2's own run stood at the early target, not from B1's weights: a reading, not a
    measurement. Added after version 4's runs; no goal reads it."""
    protocol, name = result["protocol"], workload["name"]
    early, late = workload["targets"]
    measure = protocol.get("time_measure", "train_seconds")
    static = judged[late]["arms"].get("static")
    seeds = protocol["selection_seeds"]
    batches = result["workloads"][name]["fixed_batches"]

    def times(batch: int, target: float) -> dict[int, float]:  # seed -> seconds
        runs = arm_runs(result["runs"], name, batch, seeds)
        return dict(zip([r["seed"] for r in runs], arm_times(runs, target, measure)))

    static_s = median(list(times(static, late).values())) if static is not None else math.nan
    if not math.isfinite(static_s):
        return []
    fixed = {b: median(list(times(b, late).values())) for b in batches}
    two_phase = {}
    for b1 in batches:
        for b2 in batches:
            first, whole, start = times(b1, early), times(b2, late), times(b2, early)
            both = sorted(set(first) & set(whole))
            if both:
                two_phase[(b1, b2)] = median([first[s] + whole[s] - start[s] for s in both])
    best_fixed_b = min(fixed, key=lambda b: fixed[b])
    (b1, b2) = min(two_phase, key=lambda pair: two_phase[pair])
    bound = protocol["goals"]["adaptive_over_static_late"]
    return [f"- Added after the runs (no goal reads it): what a schedule of these batches "
            f"could reach at {late:.0%} against the static choice (B = {static}), from the "
            f"fixed runs of the selection seeds {list(seeds)}: the best fixed B "
            f"({best_fixed_b}) {fixed[best_fixed_b] / static_s:.2f}x; the best two-phase "
            f"schedule (B = {b1} to {early:.0%}, then B = {b2}'s own time from {early:.0%} "
            f"to {late:.0%}) {two_phase[(b1, b2)] / static_s:.2f}x; the goal asks "
            f"{bound}x.", ""]
