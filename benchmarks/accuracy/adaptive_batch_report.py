"""The adaptive-batch benchmark's analysis and report (`benchmarks.accuracy.adaptive_batch`),
pure functions of the recorded result: per workload and target, the best fixed B picked on
the selection seeds, the arms scored on the scoring seeds, the ratios of their median times
with bootstrap intervals, the goals' verdicts, and the GPU projection.

The run records are read by `adaptive_batch_runs`; the readings added after the runs,
which no goal reads, are `adaptive_batch_post_hoc`'s and `adaptive_batch_efficiency`'s.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.accuracy.adaptive_batch_efficiency import efficiency_lines
from benchmarks.accuracy.adaptive_batch_post_hoc import (like_for_like_lines, overhead_lines,
                                                         plan_speed_lines, reach_lines,
                                                         switch_lines)
from benchmarks.accuracy.adaptive_batch_protocol import projected_seconds
from benchmarks.accuracy.adaptive_batch_runs import (ADAPTIVE, arm_runs, arm_times,
                                                     judges_training_part, median,
                                                     shows_speed, step_ms, steps_by_batch)
from benchmarks.common import markdown_table
from benchmarks.common.bootstrap import ratio, ratio_of_medians

PROTOCOL_V1_FILE = "benchmarks/accuracy/adaptive_batch_protocol.py"


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
    training_part = judges_training_part(result)
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


def _ms(runs: list[dict]) -> str:
    value = median([step_ms(r) for r in runs])
    return "n/a" if math.isnan(value) else f"{value:.3g}"


# --------------------------------------------------------------------------- report


def _selection_table(result: dict[str, Any], workload: dict[str, Any],
                     judged: dict[float, dict]) -> str:
    early, late = workload["targets"]
    batches = list(judged[early]["selection"])
    rows = [[b, _seconds(judged[early]["selection"][b]), _seconds(judged[late]["selection"][b])]
            for b in batches]
    header = ["B", f"median s to {early:.0%}", f"median s to {late:.0%}"]
    if shows_speed(result):
        seeds = result["protocol"]["selection_seeds"]
        for row, batch in zip(rows, batches):
            row.append(_ms(arm_runs(result["runs"], workload["name"], batch, seeds)))
        header.append("ms/step")
    return markdown_table(header, rows)


def _scoring_table(result: dict[str, Any], workload: dict[str, Any], target: float,
                   judged: dict[str, Any]) -> str:
    step_s = {int(b): s for b, s in result["gpu"]["step_s"].get(workload["name"], {}).items()}
    speed = shows_speed(result)
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
    lines += like_for_like_lines(result, workload, judged)
    lines += reach_lines(result, workload, judged)
    lines += plan_speed_lines(result, workload)
    lines += overhead_lines(result, workload)
    lines += switch_lines(result["workloads"][workload["name"]].get("switches"))
    return lines + efficiency_lines(result, workload)


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
