"""The adaptive-batch benchmark's analysis and report (`benchmarks.accuracy.adaptive_batch`),
pure functions of the recorded result: per workload and target, the best fixed B picked on
the selection seeds, the arms scored on the scoring seeds, the ratios of their median times
with bootstrap intervals, the goals' verdicts, and the GPU projection.

A run record (one line of results/adaptive_batch.runs.jsonl): workload, batch (an int, or
"adaptive"), seed, evaluations (train's rows: steps, samples, seconds, val_accuracy, and
global_batch where the run records it), eval_seconds_each, test_accuracy, wall_s, notes.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.accuracy.adaptive_batch_efficiency import efficiency_lines
from benchmarks.accuracy.adaptive_batch_protocol import projected_seconds
from benchmarks.common import markdown_table
from benchmarks.common.bootstrap import ratio, ratio_of_medians

ADAPTIVE = "adaptive"
PROTOCOL_V1_FILE = "benchmarks/accuracy/adaptive_batch_protocol.py"
UNREACHED = {"seconds": math.inf, "train_seconds": math.inf, "samples": math.inf,
             "steps": math.inf}


def time_to_target(run: dict[str, Any], target: float) -> dict[str, float]:
    """The first evaluation of `run` at or above `target`: its seconds (train's clock),
    train_seconds (those less the evaluations so far, each the run's mean), samples and
    steps; inf throughout when none is."""
    for count, row in enumerate(run["evaluations"], start=1):
        if row["val_accuracy"] >= target:
            return {"seconds": row["seconds"],
                    "train_seconds": row["seconds"] - count * run["eval_seconds_each"],
                    "samples": row["samples"], "steps": row["steps"]}
    return dict(UNREACHED)


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


def best_fixed(runs: list[dict], workload: str, batches, seeds, target: float,
               measure: str) -> tuple[int | None, dict[int, float]]:
    """(the B with the least median time over `seeds`, ties to the smaller B; the medians):
    the selection, on the selection seeds only. None when no B has a run."""
    medians = {b: median(arm_times(arm_runs(runs, workload, b, seeds), target, measure))
               for b in batches}
    known = {b: m for b, m in medians.items() if not math.isnan(m)}
    return (min(known, key=lambda b: (known[b], b)) if known else None), medians


def _projection(runs: list[dict], target: float, step_s: dict[int, float]) -> str:
    """The median over the runs of their projected GPU seconds, or why there is none."""
    projected = [projected_seconds(steps_by_batch(r, target), step_s) for r in runs]
    if not projected:
        return "n/a"
    missing = [why for seconds, why in projected if seconds is None]
    return missing[0] if missing else _seconds(median([s for s, _ in projected]))


def _seconds(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.3g}" if math.isfinite(value) else "not reached"


def _interval(point: float, low: float, high: float) -> str:
    if math.isnan(point):
        return "n/a"
    return f"{point:.2f} [{low:.2f}, {high:.2f}]"


def _verdict(value: float, bound: float, missing: str) -> str:
    if math.isnan(value):
        return f"n/a ({missing})"
    return "yes" if value <= bound else "**no**"


# --------------------------------------------------------------------------- judging

def judge(result: dict[str, Any], workload: dict[str, Any], target: float) -> dict[str, Any]:
    """One workload at one target: the selection (every fixed B's median time on the
    selection seeds, the best), the arms scored on the scoring seeds (their B and times),
    and adaptive's ratio of medians to each other arm with its bootstrap interval."""
    protocol, name = result["protocol"], workload["name"]
    planned = result["workloads"][name]
    measure = protocol.get("time_measure", "train_seconds")
    best, selection = best_fixed(result["runs"], name, planned["fixed_batches"],
                                 protocol["selection_seeds"], target, measure)
    arms = {"adaptive": ADAPTIVE, "best fixed": best,
            "static": planned["static"].get(str(target)), "M0": planned["reference_batch"]}
    scored = {label: arm_runs(result["runs"], name, batch, protocol["scoring_seeds"])
              for label, batch in arms.items() if batch is not None}
    times = {label: arm_times(runs, target, measure) for label, runs in scored.items()}
    boot = protocol["bootstrap"]
    ratios = {other: ratio_of_medians(times["adaptive"], times[other], boot["resamples"],
                                      boot["seed"], tuple(boot["percentiles"]))
              for other in ("best fixed", "static", "M0") if other in times}
    return {"best": best, "selection": selection, "arms": arms, "scored": scored,
            "times": times, "ratios": ratios}


def _judges_training_part(result: dict[str, Any]) -> bool:
    """Whether the plan's adaptive row is judged by its training part (version 2's
    `plan_row_measure`), not by its whole time (version 1)."""
    return result["protocol"].get("plan_row_measure") == "training"


def verdicts(result: dict[str, Any], workload: dict[str, Any],
             judged: dict[float, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(goal, value, verdict) for each of issue 44's goals on one workload."""
    goals, name = result["protocol"]["goals"], workload["name"]
    missing = result.get("adaptive_arm", "no adaptive runs")
    early, late = workload["targets"]
    rows = []
    for target in (early, late):
        point, low, high = judged[target]["ratios"].get("best fixed", (math.nan,) * 3)
        rows.append((f"adaptive / best fixed B at {target:.0%} <= "
                     f"{goals['adaptive_over_best_fixed']}", _interval(point, low, high),
                     _verdict(point, goals["adaptive_over_best_fixed"], missing)))
    point, low, high = judged[late]["ratios"].get("static", (math.nan,) * 3)
    rows.append((f"adaptive / the plan's static choice at {late:.0%} <= "
                 f"{goals['adaptive_over_static_late']}", _interval(point, low, high),
                 _verdict(point, goals["adaptive_over_static_late"], missing)))
    training_part = _judges_training_part(result)
    predicted = result["workloads"][name].get(
        "plan_adaptive_train_s" if training_part else "plan_adaptive_s") or {}
    label = "the plan's adaptive row's training part" if training_part else \
        "the plan's adaptive row"
    for target in (early, late):
        measured = median(judged[target]["times"].get("adaptive", []))
        plan_s = predicted.get(str(target))
        error = math.nan if plan_s is None else abs(ratio(plan_s, measured) - 1)
        why = "the plan has no adaptive row" if plan_s is None else missing
        rows.append((f"{label} at {target:.0%}: abs(predicted / measured - 1) <= "
                     f"{goals['plan_adaptive_error']:.0%}",
                     "n/a" if math.isnan(error) else f"{error:.0%}",
                     _verdict(error, goals["plan_adaptive_error"], why)))
    return rows


def _like_for_like(result: dict[str, Any], workload: dict[str, Any],
                   judged: dict[float, dict]) -> list[str]:
    """The part of the plan's adaptive row the goal does not judge, against the adaptive
    runs' median. Version 1 judged the whole row: its training part alone, read post hoc.
    Version 2 judges the training part: the whole row (start-up and evaluations
    included), reported beside, not judged."""
    training_part = _judges_training_part(result)
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
                "the adaptive runs' median: " + "; ".join(parts) + ".", ""]
    return ["- Post hoc, after the runs (not a goal's verdict): the plan's adaptive row "
            "counts the run's start-up and each epoch's evaluation, which the protocol's "
            "time leaves out; its training part alone against the adaptive runs' median: "
            + "; ".join(parts) + ".", ""]


def _plan_speed_lines(result: dict[str, Any], workload: dict[str, Any]) -> list[str]:
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


def step_ms(run: dict[str, Any]) -> float:
    """The run's mean milliseconds per optimizer step, evaluations left out: how fast the
    machine ran it (version 2's report shows it per arm)."""
    rows = run["evaluations"]
    if not rows or not rows[-1]["steps"]:
        return math.nan
    last = rows[-1]
    return 1000 * (last["seconds"] - len(rows) * run["eval_seconds_each"]) / last["steps"]


def _ms(runs: list[dict]) -> str:
    value = median([step_ms(r) for r in runs])
    return "n/a" if math.isnan(value) else f"{value:.3g}"


# --------------------------------------------------------------------------- report

def _shows_speed(result: dict[str, Any]) -> bool:
    """Version 2 on shows each arm's milliseconds per step."""
    return result["protocol"]["version"] >= 2


def _selection_table(result: dict[str, Any], workload: dict[str, Any],
                     judged: dict[float, dict]) -> str:
    early, late = workload["targets"]
    batches = list(judged[early]["selection"])
    rows = [[b, _seconds(judged[early]["selection"][b]), _seconds(judged[late]["selection"][b])]
            for b in batches]
    header = ["B", f"median s to {early:.0%}", f"median s to {late:.0%}"]
    if _shows_speed(result):
        seeds = result["protocol"]["selection_seeds"]
        for row, batch in zip(rows, batches):
            row.append(_ms(arm_runs(result["runs"], workload["name"], batch, seeds)))
        header.append("ms/step")
    return markdown_table(header, rows)


def _scoring_table(result: dict[str, Any], workload: dict[str, Any], target: float,
                   judged: dict[str, Any]) -> str:
    step_s = {int(b): s for b, s in result["gpu"]["step_s"].get(workload["name"], {}).items()}
    speed = _shows_speed(result)
    rows = []
    for label, batch in judged["arms"].items():
        runs, times = judged["scored"].get(label, []), judged["times"].get(label, [])
        rows.append([label, batch if batch is not None else "n/a", _seconds(median(times)),
                     f"{sum(math.isfinite(t) for t in times)}/{len(times)}",
                     _seconds(median([r["test_accuracy"] * 100 for r in runs])),
                     *([_ms(runs)] if speed else []), _projection(runs, target, step_s)])
    return markdown_table(["arm", "B", "median s", "reached", "test accuracy %",
                           *(["ms/step"] if speed else []), "GPU projection s"], rows)


def _workload_section(result: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    judged = {t: judge(result, workload, t) for t in workload["targets"]}
    protocol = result["protocol"]
    sources = "; ".join(f"{t:.0%}: {s}" for t, s in zip(workload["targets"],
                                                         workload["target_sources"]))
    lines = [f"#### {workload['name']}\n",
             f"{workload['train_images']} training and {workload['val_images']} validation "
             f"images, evaluated every {workload['eval_every_samples']} samples, at most "
             f"{workload['max_epochs']} epochs. Targets ({sources}).\n",
             f"Selection (seeds {list(protocol['selection_seeds'])}), every fixed B:\n",
             _selection_table(result, workload, judged), ""]
    for target in workload["targets"]:
        lines += [f"Scored at {target:.0%} (seeds {list(protocol['scoring_seeds'])}; best "
                  f"fixed B picked on the selection seeds: {judged[target]['best']}):\n",
                  _scoring_table(result, workload, target, judged[target]), ""]
        lines += [f"- adaptive / {other}: {_interval(*values)}"
                  for other, values in judged[target]["ratios"].items()]
        lines.append("")
    lines += [markdown_table(["goal", "value", "met"], verdicts(result, workload, judged)), ""]
    lines += _like_for_like(result, workload, judged)
    lines += _plan_speed_lines(result, workload)
    lines += _overhead_lines(result, workload)
    lines += _switch_lines(result["workloads"][workload["name"]].get("switches"))
    return lines + efficiency_lines(result, workload)


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


def _overhead_lines(result: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    if not _shows_speed(result):
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


def _switch_lines(switches: list[dict] | None) -> list[str]:
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


def report(result: dict[str, Any]) -> str:
    """The markdown report, from the recorded result alone."""
    protocol, boot = result["protocol"], result["protocol"]["bootstrap"]
    lines = ["### Adaptive batch against fixed batches: time to accuracy (issue 44, item 4)\n",
             f"`{result['command']}` at {result['commit']}, {result['date']}, "
             f"{result['machine']}.\n",
             f"Protocol version {protocol['version']} "
             f"({protocol.get('protocol_file', PROTOCOL_V1_FILE)}, committed before the first "
             f"recorded run). N = {protocol['world_size']}, {protocol['strategy']} for every "
             "arm; time = `train`'s time to the target less its evaluations; medians over "
             f"the scoring seeds, ratios with {boot['resamples']}-resample bootstrap "
             f"intervals ({boot['percentiles'][0]}-{boot['percentiles'][1]} %). Adaptive "
             f"arm: {result.get('adaptive_arm', 'ok')}. {result['limit']}\n",
             f"GPU projection (a projection, not a measurement): {result['gpu']['source']}.\n"]
    for workload in protocol["workloads"]:
        lines += _workload_section(result, workload)
    return "\n".join(lines) + "\n"
