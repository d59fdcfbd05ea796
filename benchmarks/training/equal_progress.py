"""Issue 25, item 5: Table I at equal progress. AGS-NS at B = 512, 1024 and 2048 trained
with the scale-invariant budget (`tula_ray.training.budget`) of the reference's 20 epochs
at B = 32, beside the B = 32 plain-SGD reference trained for those 20 epochs.

The setup is the generalization benchmark's Table I analog (`benchmarks.training.generalization`:
Fashion-MNIST, a fixed 10k-image subset, the small CNN, N = 2 gloo workers, each run set
up by `prepare_run` and trained by `Run.train_epochs`, the code `tula_ray.train` runs);
only the budget differs: each AGS-NS run trains until AdaScale's progress (its gain summed
over the steps) reaches 20 epochs' worth of B = 32 steps, between 20 and 20 x B / 32
epochs. Seeds run in turn (every batch of seed 0, then seed 1, ...), so a session that
ends early leaves whole seeds. Resumable: runs are appended to equal_progress.runs.jsonl as
they finish, and a run already recorded is not run again.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.common import Benchmark, markdown_table, recorded_runs
from benchmarks.training.generalization import run_on_rank
from benchmarks.training.generalization_runs import (EPOCHS, LARGE_BATCHES, REFERENCE_BATCH, SEEDS,
                                                     TRAIN_SUBSET, WORLD_SIZE)

NAME = "equal_progress"
BUDGET = "scale-invariant"
# --quick, a smoke test: scored on the test set's first images (the full 10k took most of its
# time), as generalization's --quick is.
QUICK = {"train_subset": 512, "epochs": 1, "seeds": (0,), "batches": (64,), "test_subset": 1000}
GOAL_POINTS = 0.5  # issue 25: within 0.5 points of the reference at B = 1024 and 2048
GOAL_BATCHES = (1024, 2048)
DIVERGED_ACCURACY = 0.2  # Fashion-MNIST has 10 classes: at or below 2x chance, diverged


def plan_runs(train_subset: int, epochs: int, seeds, batches,
              test_subset: int | None = None) -> list[dict[str, Any]]:
    """test_subset: score on the test set's first images only."""
    runs, scored = [], {} if test_subset is None else {"test_subset": test_subset}
    for seed in seeds:
        common = {"train_subset": train_subset, "epochs": epochs, "seed": seed, **scored}
        runs.append({**common, "label": "reference", "strategy": "lbt", "options": {},
                     "global_batch": REFERENCE_BATCH, "budget": "epochs"})
        runs += [{**common, "label": "ags-ns equal progress", "strategy": "ags-ns",
                  "options": {}, "global_batch": batch, "budget": BUDGET} for batch in batches]
    return runs


def run_key(run: dict) -> tuple:
    return (run["label"], run["global_batch"], run["seed"], run["epochs"], run["train_subset"],
            run["budget"])


def run(quick: bool = False, seeds: int | None = None) -> dict:
    """seeds: only the first `seeds` of the settings' (the report says which ran)."""
    settings = QUICK if quick else {"train_subset": TRAIN_SUBSET, "epochs": EPOCHS,
                                    "seeds": SEEDS, "batches": LARGE_BATCHES}
    if seeds is not None:
        settings = {**settings, "seeds": tuple(settings["seeds"][:seeds])}
    benchmark = Benchmark(NAME, quick)
    recorded = recorded_runs(run_on_rank, plan_runs(**settings), benchmark.log(), run_key,
                             WORLD_SIZE)
    return benchmark.record({"quick": quick, "settings": settings,
                             "rows": summarize(recorded, settings["epochs"])}, report,
                            nested=True)


def summarize(runs: list[dict], epochs: int) -> list[dict[str, Any]]:
    """Per (label, B): the seeds, their final test accuracy, epochs trained, progress in
    reference epochs and wall time; each AGS-NS row against the reference of the same seeds."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["label"], r["global_batch"]), []).append(r)
    reference = {r["seed"]: r["test_accuracy"] for r in groups.get(("reference",
                                                                     REFERENCE_BATCH), [])}
    rows = []
    for (label, batch), group in sorted(groups.items(), key=lambda kv: kv[0][1]):
        accuracy = [r["test_accuracy"] for r in group]
        last = [r["history"][-1] for r in group]
        same_seeds = [r for r in group if r["seed"] in reference]
        gaps = [100 * (r["test_accuracy"] - reference[r["seed"]]) for r in same_seeds]
        rows.append({
            "label": label, "global_batch": batch, "seeds": sorted(r["seed"] for r in group),
            "test_accuracy": statistics.fmean(accuracy),
            "accuracy_spread": max(accuracy) - min(accuracy),
            "epochs_trained": statistics.fmean(len(r["history"]) for r in group),
            "progress_epochs": statistics.fmean(h.get("progress_epochs", math.nan)
                                                for h in last),
            "wall_s": statistics.fmean(r["wall_s"] for r in group),
            "gap_points": statistics.fmean(gaps) if gaps else math.nan,
            "diverged": sum(1 for a in accuracy if not a > DIVERGED_ACCURACY),
            "budget_epochs": epochs,
        })
    return rows


def report(result: dict) -> str:
    p, s = result["provenance"], result["settings"]
    scored = "" if s.get("test_subset") is None else \
        f" (--quick: on the test set's first {s['test_subset']} images)"
    body = [[r["label"], r["global_batch"], len(r["seeds"]),
             f"{100 * r['test_accuracy']:.2f}", f"{100 * r['accuracy_spread']:.2f}",
             f"{r['gap_points']:+.2f}" if math.isfinite(r["gap_points"]) else "-",
             f"{r['epochs_trained']:.1f}",
             f"{r['progress_epochs']:.2f}" if math.isfinite(r["progress_epochs"]) else "-",
             f"{r['wall_s']:.0f}", r["diverged"]] for r in result["rows"]]
    lines = ["### Table I at equal progress: AGS-NS with the scale-invariant budget (issue 25, "
             "item 5)\n",
             f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
             f"Fashion-MNIST CNN, {s['train_subset']}-image training subset, N = {WORLD_SIZE} "
             f"gloo workers, seeds {list(s['seeds'])}. The reference trains plain SGD at B = {REFERENCE_BATCH} for "
             f"{s['epochs']} epochs; AGS-NS trains until AdaScale's progress reaches "
             f"{s['epochs']} epochs at B = {REFERENCE_BATCH} (`budget='scale-invariant'`). "
             f"Test accuracy{scored} is the mean over the seeds of the last epoch's; the gap is "
             "to the reference of the same seeds; wall is one run's seconds, evaluation "
             "included.\n",
             markdown_table(["run", "B", "seeds", "test accuracy %", "spread (max - min)",
                             "gap to reference (points)", "epochs trained",
                             "progress (reference epochs)", "wall s", "diverged"], body), ""]
    goal_rows = [r for r in result["rows"] if r["label"] != "reference"
                 and r["global_batch"] in GOAL_BATCHES and math.isfinite(r["gap_points"])]
    if goal_rows:
        met = all(r["gap_points"] >= -GOAL_POINTS and r["diverged"] == 0 for r in goal_rows)
        named = ", ".join(f"B = {r['global_batch']}: {r['gap_points']:+.2f} points over "
                          f"{len(r['seeds'])} seed(s)" for r in goal_rows)
        lines.append(f"- Goal (within {GOAL_POINTS} points of the reference at B = 1024 and "
                     f"2048, no seed diverged): {'met' if met else 'not met'} ({named}).")
    return "\n".join(lines) + "\n"
