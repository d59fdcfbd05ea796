"""What the adaptive-batch benchmark reads from its plan (issue 44, item 4): per target,
the arms the selection runs decide (`planned_arms`: E0, the static choice re-planned for
it, the best fixed B) beside the plan's predictions (its adaptive row's time and batches,
its step time per B), and each adaptive run's switches explained from the plan's options
(`explained_switches`). No Ray, no training.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.accuracy.adaptive_batch_protocol import (TIME_MEASURE, WORLD_SIZE, Protocol,
                                                         WorkloadProtocol)
from benchmarks.accuracy.adaptive_batch_report import best_fixed
from benchmarks.accuracy.adaptive_batch_runs import arm_runs, time_to_target


def _adaptive_row(plan):
    """The plan's "adaptive at N" row at the protocol's N (`Plan.adaptive`, issue 44,
    item 2); None where the plan has none (no noise scale measured)."""
    rows = plan.adaptive
    at_n = rows if rows.empty else rows[rows["num_workers"] == WORLD_SIZE]
    return None if at_n.empty else at_n.iloc[0]


def plan_adaptive_seconds(plan) -> float | None:
    """The plan's predicted time to its target for the adaptive batch at the protocol's N:
    its adaptive row's; None without one (the report says "the plan has no adaptive
    row")."""
    row = _adaptive_row(plan)
    return None if row is None else float(row["time_to_accuracy_s"])


def plan_adaptive_training_s(plan) -> float | None:
    """The part of the plan's adaptive row that the protocol's measure counts (issue 44,
    a post-hoc reading, added after the runs): its time to the target less the start-up
    and the epochs' evaluations and checkpoints, which `train_seconds` leaves out. The
    row's own figure (`plan_adaptive_seconds`) stays the pre-registered prediction."""
    row = _adaptive_row(plan)
    if row is None:
        return None
    fixed = plan.table[plan.table["num_workers"] == WORLD_SIZE]
    per_epoch = float((fixed["eval_time_s"] + fixed["checkpoint_time_s"]).median())
    return float(row["time_to_accuracy_s"] - row["startup_time_s"]
                 - row["epochs_to_target"] * per_epoch)


def plan_step_ms(plan) -> dict[str, float]:
    """B -> the plan's milliseconds per step at the protocol's N, as its fixed rows' and
    adaptive row's training parts count it: an epoch's training (measured where profiled,
    the strategy's cost included; start-up, evaluation and checkpoint left out) over its
    floor(D / B) steps. Added after version 3's runs, to read the plan row's error."""
    rows = plan.table[plan.table["num_workers"] == WORLD_SIZE]
    epoch_s = ((rows["estimated_total_time_s"] - rows["startup_time_s"]) / plan.epochs
               - rows["eval_time_s"] - rows["checkpoint_time_s"])
    steps = plan.dataset_size // rows["global_batch"]
    return {str(int(b)): float(1000 * s / n)
            for b, s, n in zip(rows["global_batch"], epoch_s, steps)}


def fixed_batches(plan) -> list[int]:
    """The plan's batches at the protocol's N: the fixed-B arms."""
    table = plan.table
    return sorted(int(b) for b in table.loc[table["num_workers"] == WORLD_SIZE, "global_batch"])


def planned_arms(plan, workload: WorkloadProtocol, runs: list[dict],
                 protocol: Protocol) -> dict[str, Any]:
    """What the selection runs decide, from validation data only: per target, E0 (the
    median epochs of the B = M0 runs), the plan's static choice re-planned for it, the
    plan's adaptive prediction, and the best fixed B."""
    from benchmarks.accuracy.time_to_accuracy import replanned

    batches = fixed_batches(plan)
    m0 = int(plan.meta.get("reference_batch", batches[0]))
    arms: dict[str, Any] = {"fixed_batches": batches, "reference_batch": m0, "e0": {},
                            "static": {}, "plan_adaptive_s": {}, "best": {}}
    for target in workload.targets:
        samples = [time_to_target(r, target)["samples"] for r in
                   arm_runs(runs, workload.name, m0, protocol.selection_seeds)]
        e0 = statistics.median(samples) / workload.train_images if samples else float("inf")
        arms["e0"][str(target)] = e0
        arms["best"][str(target)] = best_fixed(runs, workload.name, batches,
                                               protocol.selection_seeds, target, TIME_MEASURE)[0]
        if e0 == float("inf"):
            continue
        # The static choice: the plan's best fixed B for this target (its adaptive row,
        # predicted beside, is the adaptive arm's prediction).
        made = replanned(plan, round(e0), workload.train_images, "time_to_accuracy",
                         adaptive_batch=False)
        arms["static"][str(target)] = made.choice.global_batch
        arms["plan_adaptive_s"][str(target)] = plan_adaptive_seconds(made)
        arms.setdefault("plan_adaptive_train_s", {})[str(target)] = plan_adaptive_training_s(
            made)
        row = _adaptive_row(made)
        arms.setdefault("plan_adaptive_batches", {})[str(target)] = (
            None if row is None else row["batches"])
    arms["plan_step_ms"] = plan_step_ms(plan)
    return arms


def explained_switches(plan, runs: list[dict]) -> list[dict[str, Any]]:
    """Each adaptive run's changes of B, explained by what it recorded: the adapter decides
    at the same step as each evaluation (both every `eval_every_samples`), from the same
    online phi, so the B evaluation i+1 records was chosen with evaluation i's
    `noise_scale`. Its goodputs are recomputed from the plan's options
    (`AdaptiveBatch.goodputs`), and the hysteresis rule (`switched_batch`) is applied
    again: `reproduced` says whether it chooses the B the run switched to."""
    from tula_ray.models.goodput import best_batch, switched_batch
    from tula_ray.runs.adaptive_batch import adaptive_batch_of

    switches = []
    for run in runs:
        evaluations = run["evaluations"]
        controller = adaptive_batch_of(plan, WORLD_SIZE, int(evaluations[0]["global_batch"]))
        for before, after in zip(evaluations, evaluations[1:]):
            old, new = int(before["global_batch"]), int(after["global_batch"])
            if old == new:
                continue
            goodputs = controller.goodputs(float(before["noise_scale"]))
            switches.append({
                "seed": run["seed"], "samples": before["samples"],
                "val_accuracy": before["val_accuracy"], "noise_scale": before["noise_scale"],
                "from": old, "to": new, "gain": goodputs[new] / goodputs[old] - 1,
                "best": best_batch(goodputs),
                "reproduced": switched_batch(old, goodputs, controller.min_gain) == new})
    return switches
