"""The time-to-accuracy re-run's judging and report (`benchmarks.accuracy.time_to_accuracy_v2`,
protocol `time_to_accuracy_protocol`).

Per target, from the runs alone (validation data): each B's times to the target on the
protocol's measure (`train_seconds`: `time_to_target_s` less the evaluations before it) and
its epochs to it, one per seed; E0, the median epochs of the B = M0 runs; the best B, the
least median time. Each search's plan is re-made for E0 (`time_to_accuracy.replanned`, the
fixed rows only) and its choice for each objective judged by its regret with a bootstrap
interval (`time_to_accuracy_regret`); the first search's choice is set against "train at
M0"; and the plan's epochs (E0 / efficiency) and training seconds (those epochs times the
plan's epoch) against the measured medians. `judged_targets` runs at the end of a run (it
re-plans); `report` reads only what it recorded.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from benchmarks.accuracy.adaptive_batch_runs import median, step_ms, time_to_target
from benchmarks.accuracy.time_to_accuracy import epochs_agreement, plan_epoch_s, replanned
from benchmarks.accuracy.time_to_accuracy_regret import (M0_HEADER, m0_baseline,
                                                         m0_baseline_row, regret_interval,
                                                         regret_table)
from benchmarks.common import markdown_table
from benchmarks.common.bootstrap import Bootstrap

OBJECTIVES = ("time_to_accuracy", "time", "knee")


def per_batch(runs: Sequence[dict], target: float, measure: str,
              scale: float = 1.0) -> dict[int, list[float]]:
    """Each B's `time_to_target` figure `measure` (over `scale`), one per run (seed);
    inf where a run never reached the target."""
    values: dict[int, list[float]] = {}
    for run in runs:
        values.setdefault(int(run["batch"]), []).append(
            time_to_target(run, target)[measure] / scale)
    return dict(sorted(values.items()))


def _predicted_rows(made, e0: float, times: Mapping[int, list[float]],
                    epochs: Mapping[int, list[float]], world_size: int) -> list[dict]:
    """Per B the plan's epochs to the target (E0 / efficiency, at E0's measured, fractional
    value) and training seconds (those epochs times its epoch's steps), beside the runs'."""
    table = made.table[made.table["num_workers"] == world_size]
    rows = []
    for _, row in table.iterrows():
        batch = int(row["global_batch"])
        if batch not in times:
            continue
        predicted = e0 / float(row["efficiency"])
        rows.append({"global_batch": batch, "predicted_epochs": predicted,
                     "measured_epochs": median(epochs[batch]),
                     "predicted_train_s": predicted * float(plan_epoch_s(row)),
                     "measured_train_s": median(times[batch]),
                     "reached": sum(math.isfinite(t) for t in times[batch]),
                     "seeds": len(times[batch])})
    return rows


def judge_target(plan, runs: Sequence[dict], protocol: Mapping[str, Any],
                 target: float, first: bool) -> dict[str, Any]:
    """One search's plan at one target (the module docstring); `first`: with the M0 row."""
    bootstrap = Bootstrap(**{**protocol["bootstrap"],
                             "percentiles": tuple(protocol["bootstrap"]["percentiles"])})
    m0, train_images = protocol["reference_batch"], protocol["train_images"]
    times = per_batch(runs, target, protocol["time_measure"])
    epochs = per_batch(runs, target, "samples", scale=train_images)
    medians = {b: median(t) for b, t in times.items()}
    e0 = median(epochs.get(m0, []))
    judged: dict[str, Any] = {"e0": e0, "best_batch": min(medians, key=medians.get),
                              "times": times, "epochs": epochs, "choices": {}}
    if not math.isfinite(e0):
        return judged
    made = {objective: replanned(plan, round(e0), train_images, objective,
                                 adaptive_batch=False) for objective in OBJECTIVES}
    for objective, remade in made.items():
        chosen = remade.choice.global_batch
        judged["choices"][objective] = {
            "global_batch": chosen, "regret": regret_interval(times, chosen, bootstrap)}
    if first:
        judged["m0"] = m0_baseline(times, made["time_to_accuracy"].choice.global_batch, m0,
                                   bootstrap)
    judged["rows"] = _predicted_rows(made["time_to_accuracy"], e0, times, epochs,
                                     protocol["world_size"])
    judged.update(epochs_agreement(judged["rows"], "predicted_train_s", "measured_train_s"))
    return judged


def judged_targets(plans: Sequence, runs: Sequence[dict],
                   protocol: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every search's plan judged at every target (the first with the M0 baseline)."""
    return [{"noise_scale": plan.meta.get("noise", {}).get("noise_scale", math.nan),
             "profiling_wall_s": plan.meta.get("profiling_wall_s", math.nan),
             "targets": {str(t): judge_target(plan, runs, protocol, t, first=index == 0)
                         for t in protocol["targets"]}}
            for index, plan in enumerate(plans)]


# --------------------------------------------------------------------------- the report

def _span(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "not reached"
    text = f"{median(values):.3g} ({min(finite):.3g}-{max(finite):.3g})"
    return text if len(finite) == len(values) else text + f", {len(values) - len(finite)} unreached"


def _target_section(result: dict[str, Any], target: str) -> list[str]:
    protocol, searches = result["protocol"], result["searches"]
    first = searches[0]["targets"][target]
    lines = [f"#### Target {float(target):.0%} (validation accuracy)", "",
             f"E0 = {first['e0']:.2f} epochs (the B = {protocol['reference_batch']} runs' "
             f"median); the best B on the runs' medians: {first['best_batch']}.", ""]
    predicted = {r["global_batch"]: r for r in first.get("rows", [])}
    rows = []
    for batch, times in first["times"].items():
        plan = predicted.get(int(batch), {})
        rows.append([batch, f"{sum(math.isfinite(t) for t in times)}/{len(times)}",
                     _span(first["epochs"][batch]), _fmt(plan.get("predicted_epochs")),
                     _span(times), _fmt(plan.get("predicted_train_s"))])
    lines += [markdown_table(["B", "seeds reaching it", "epochs: median (range)",
                              "plan's epochs", "train s: median (range)", "plan's train s"],
                             rows), ""]
    if not first["choices"]:
        return lines + ["- No choice judged: the B = M0 runs never reached the target.", ""]
    choices = [(f"search {i}: {objective}", s["targets"][target]["choices"][objective]["global_batch"],
                s["targets"][target]["choices"][objective]["regret"])
               for i, s in enumerate(searches) for objective in OBJECTIVES]
    lines += [regret_table(choices), ""]
    lines += [markdown_table(M0_HEADER, [m0_baseline_row(float(target),
                                                         protocol["reference_batch"],
                                                         first["m0"])]), ""]
    for i, s in enumerate(searches):
        judged = s["targets"][target]
        lines.append(f"- search {i} (phi = {s['noise_scale']:.4g}): epochs' median |log error| "
                     f"{judged['median_log_error']:.2f}, Spearman of predicted and measured "
                     f"time {judged['spearman']:.2f}")
    return lines + [""]


def _fmt(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def report(result: dict[str, Any]) -> str:
    provenance, protocol, runs = result["provenance"], result["protocol"], result["runs"]
    lines = [
        "### Time to accuracy, re-run with `train` stopping at each target "
        "(issue 43, item 4; protocol v2)", "",
        f"`{provenance['command']}` at {provenance['commit']}, {provenance['date']}, "
        f"{provenance['machine']}.", "",
        f"The protocol (`benchmarks/accuracy/time_to_accuracy_protocol.py`, committed before "
        f"the first run): {protocol['workload']} on Fashion-MNIST's first "
        f"{protocol['train_images']} training images, its validation split the "
        f"{protocol['validation_images']} after them (the test set read once per run, for "
        f"the report), {protocol['strategy']} at N = {protocol['world_size']}, seeds "
        f"{list(protocol['seeds'])}, every B of {list(protocol['batches'])}. Each run is one "
        f"`tula_ray.train` to {max(protocol['targets']):.0%}, evaluating the validation split "
        f"every {protocol['eval_every_samples']} samples, at most {protocol['max_epochs']} "
        "epochs; the earlier targets are read from its evaluations. Time: "
        "`time_to_target_s` less the evaluations before it. Regrets: the chosen B's median "
        "over the best B's, less one, with the 2.5-97.5 % interval of "
        f"{protocol['bootstrap']['resamples']} bootstrap resamples of every B's seeds (the "
        "best picked again in each). Only validation data informed any choice here.", "",
        f"Runs: {len(runs)} of {len(protocol['seeds']) * len(protocol['batches'])}, "
        f"{sum(r['wall_s'] for r in runs) / 3600:.2f} h in all; searches: "
        f"{len(result['searches'])}.", ""]
    for target in result["searches"][0]["targets"] if result["searches"] else []:
        lines += _target_section(result, target)
    lines += speed_lines(runs)
    tests = per_batch_test(runs)
    lines.append("Test accuracy at each run's end (reported only; it informed nothing): "
                 + "; ".join(f"B = {b}: {median(v):.3f}" for b, v in tests.items()) + ".")
    return "\n".join(lines) + "\n"


UNEVEN_SPEED = 2.0  # one B's fastest and slowest runs further apart: the machine varied


def speed_lines(runs: Sequence[dict]) -> list[str]:
    """How fast the machine ran each run (milliseconds per step, evaluations left out:
    `step_ms`), B by seed, and the B whose runs differ by more than `UNEVEN_SPEED` x.
    Added after the runs, which spanned two days: it says what the times measure."""
    seeds = sorted({r["seed"] for r in runs})
    speed = {(int(r["batch"]), r["seed"]): step_ms(r) for r in runs}
    batches = sorted({b for b, _ in speed})
    rows = [[b, *(f"{speed[b, s]:.3g}" if (b, s) in speed else "" for s in seeds)]
            for b in batches]
    spans = {b: max(v) / min(v) for b in batches
             if len(v := [speed[b, s] for s in seeds if (b, s) in speed]) > 1}
    uneven = [f"B = {b}: {span:.1f}x" for b, span in spans.items() if span > UNEVEN_SPEED]
    verdict = ("Where one B's runs differ by more than "
               f"{UNEVEN_SPEED:g}x ({'; '.join(uneven)}), the machine's speed varied between "
               "them, and the times above (their medians, ranges and regrets) measure the "
               "machine as much as the batch; the epochs do not depend on it."
               if uneven else f"No B's runs differ by more than {UNEVEN_SPEED:g}x.")
    return ["#### The machine's speed in each run (added after the runs)", "",
            "Milliseconds per optimizer step (each run's train s over its steps at its last "
            "evaluation), B by seed:", "",
            markdown_table(["B", *(f"seed {s}" for s in seeds)], rows), "", verdict, ""]


def per_batch_test(runs: Sequence[dict]) -> dict[int, list[float]]:
    tests: dict[int, list[float]] = {}
    for run in runs:
        tests.setdefault(int(run["batch"]), []).append(run["test_accuracy"])
    return dict(sorted(tests.items()))
