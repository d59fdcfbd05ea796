"""Issue 24 figures: does the plan predict the epochs that `tula_ray.train` runs?

For each workload, ONE full search (`tula_ray.search(strategy="full")`, plain SGD "lbt",
N in {1, 2}) writes the plan; then every profiled (N, B) is trained with
`tula_ray.train` for 3 epochs, `REPEATS` times, the runs interleaved (each repeat goes
over every candidate before the next starts), and the median `seconds` of epochs 2-3
(the first one warms up) is set beside the plan's `epoch_time_s`, which was written
before any training ran and is never refitted on it. Then the demo's own plan (the
partial search with the default AGS-NS, as `tula-ray demo` runs it) against
`train(plan, epochs=3)` for its choice, with the plan's own training strategy, as a user
types it; `DEMO_REPEATS` times, each a new search followed by its training (a plan
measured under one load and trained under another is what a single pair would show),
and the demo's profiling wall time. The CNN has a second, bf16 search and runs (autocast
on the CPU): the plan's bf16 epochs against `train`'s, and bf16 over fp32 both ways.

Every run is appended to train_time.runs.jsonl as it ends, the plans kept beside it: a
run that stops part-way goes on from what it recorded. Writes train_time.{json,md}.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, provenance, write_result
from benchmarks.train_time_report import report

# Three runs per cell: the median of three resists one slow run, which two (their mean)
# do not; the machine's runs of one cell differ by up to 20 % (NOTES-ENV).
REPEATS = 3
DEMO_REPEATS = 3  # a new demo search and its choice's training, each time
EPOCHS = 3
# (label, workload, options, (min, max) batch of the search, the batches trained): subsets
# of Fashion-MNIST's training images (its first ones) so that a run takes a minute or two
# on 2 CPU cores; the CNN's runs at every other profiled batch, for the same reason; the
# CNN again in bf16 (autocast on the CPU; its own search), at two batches. The demo's plan
# below is the full data set's.
WORKLOADS = (
    ("fashion-mnist-cnn", "fashion-mnist-cnn", {"train_subset": 30_000}, (32, 2048),
     (32, 128, 512, 2048)),
    ("resnet18-fashion-mnist", "resnet18-fashion-mnist", {"train_subset": 1024}, (64, 256),
     (64, 128, 256)),
    ("fashion-mnist-cnn-bf16", "fashion-mnist-cnn",
     {"train_subset": 30_000, "precision": "bf16"}, (32, 2048), (128, 512)))
BF16_OF = {"fashion-mnist-cnn-bf16": "fashion-mnist-cnn"}  # a bf16 label: its fp32 one
# The smoke test: one worker, one batch, two epochs (the second one is compared).
QUICK_WORKLOADS = (("fashion-mnist-cnn", "fashion-mnist-cnn", {"train_subset": 1024},
                    (256, 256), (256,)),)
QUICK_EPOCHS = 2


def _name(quick: bool) -> str:
    return "train_time_quick" if quick else "train_time"


def _recorded(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as stream:
        stream.write(json.dumps(record, default=float) + "\n")


def _plan(path: Path, **search_args):
    """The recorded plan, else a new search's (kept at `path`)."""
    from tula_ray import search
    from tula_ray.planning.plan import Plan

    if path.exists():
        return Plan.from_json(path)
    plan = search(**search_args)
    plan.to_json(path)
    return plan


def _choosing(plan, num_workers: int, global_batch: int):
    """The plan with (N, B) as its choice: what `train` trains."""
    return dataclasses.replace(plan, choice=dataclasses.replace(
        plan.choice, num_workers=num_workers, global_batch=global_batch))


def _train_seconds(plan, strategy: str, options: dict, storage: str,
                   epochs: int) -> dict[str, list]:
    """Each epoch's training `seconds` and `eval_seconds` of one `tula_ray.train` run of
    the plan's choice, and the whole call's seconds (`wall_s`: what the user waits for,
    Ray Train's start and end included; Ray itself is already up)."""
    import time

    from tula_ray import train

    started = time.perf_counter()
    result = train(plan, strategy, workload_options=options or None, epochs=epochs,
                   storage_path=storage)
    return {"epoch_seconds": [float(s) for s in result.metrics["seconds"]],
            "eval_seconds": [float(s) for s in result.metrics["eval_seconds"]],
            "wall_s": time.perf_counter() - started}


def _measure(key: dict[str, Any], runs: list[dict], path: Path, plan, strategy: str,
             options: dict, storage: str, epochs: int = EPOCHS) -> None:
    if any(all(run.get(k) == v for k, v in key.items()) for run in runs):
        return
    seconds = _train_seconds(_choosing(plan, key["num_workers"], key["global_batch"]),
                             strategy, options, storage, epochs)
    # The tree each run trained at: a resumed benchmark mixes runs of several commits.
    record = {**key, **seconds, "commit": provenance()["commit"]}
    _append(path, record)
    runs.append(record)
    print(f"{key}: epochs {', '.join(f'{s:.2f}' for s in seconds['epoch_seconds'])} s",
          flush=True)


def run(quick: bool = False) -> dict:
    import tempfile

    from tula_ray.cluster import ray_session

    name = _name(quick)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    runs_path = RESULTS_DIR / f"{name}.runs.jsonl"
    if quick:  # a smoke test starts afresh; the full run goes on from what it recorded
        for stale in RESULTS_DIR.glob(f"{name}*"):
            stale.unlink()
    runs = _recorded(runs_path)
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    repeats = 1 if quick else REPEATS
    epochs = QUICK_EPOCHS if quick else EPOCHS
    sizes = (1,) if quick else (1, 2)
    storage = tempfile.mkdtemp(prefix="tula-train-time-")
    plans = {}
    with ray_session(None, None):
        for label, workload, options, (low, high), _ in workloads:
            plans[label] = _plan(
                RESULTS_DIR / f"{name}_{label}.plan.json", workload=workload,
                workload_options=options or None, cluster_sizes=sizes, min_batch=low,
                max_batch=high, strategy="full", training_strategy="lbt", epochs=epochs)
        for repeat in range(repeats):
            for label, _, options, _, trained in workloads:
                plan = plans[label]
                for n, b in [(n, b) for n, b in _profiled(plan) if b in trained]:
                    _measure({"workload": label, "num_workers": n, "global_batch": b,
                              "strategy": "lbt", "repeat": repeat}, runs, runs_path, plan,
                             "lbt", options, storage, epochs)
        demos = []
        for repeat in range(0 if quick else DEMO_REPEATS):
            demo = _plan(RESULTS_DIR / f"{name}_demo{repeat}.plan.json",
                         workload="fashion-mnist-cnn", cluster_sizes=(1, 2), min_batch=32,
                         max_batch=2048)
            strategy = demo.meta["training_strategy"]  # what `train(plan)` runs by default
            _measure({"workload": f"demo{repeat}", "num_workers": demo.choice.num_workers,
                      "global_batch": demo.choice.global_batch, "strategy": strategy,
                      "repeat": 0}, runs, runs_path, demo, strategy, {}, storage)
            demos.append(demo)
    result = {"provenance": provenance(), "epochs": epochs, "repeats": repeats,
              "demo_repeats": len(demos), "rows": _compare(plans, demos, runs),
              "run_commits": _run_commits(runs)}
    if demos:
        result["demo_profiling_wall_s"] = [d.meta.get("profiling_wall_s") for d in demos]
        result["demo_launches"] = [d.meta.get("launches") for d in demos]
    result["summary"] = _summary(result["rows"])
    result["precision"] = _precision_ratios(result["rows"])
    if repeats > 2:  # what the earlier two-run grid would say of these same runs
        result["summary_two_runs"] = _summary(
            _compare(plans, demos, [r for r in runs if r["repeat"] < 2]))
    markdown = report(result)
    write_result(name, result, markdown)
    print(markdown)
    return result


def _run_commits(runs: list[dict]) -> dict[str, dict[str, int]]:
    """{"grid" | "demo": {commit: runs}}: the trees the recorded runs trained at (runs
    recorded before commits were kept count as "not recorded")."""
    counts: dict[str, Counter] = {"grid": Counter(), "demo": Counter()}
    for run in runs:
        counts["demo" if run["workload"].startswith("demo") else "grid"][
            run.get("commit", "not recorded")] += 1
    return {part: dict(counted) for part, counted in counts.items()}


def _profiled(plan) -> list[tuple[int, int]]:
    rows = plan.table[plan.table["estimate"] == "measured"]
    return sorted(zip(rows["num_workers"].astype(int), rows["global_batch"].astype(int)))


def _compare(plans: dict, demos: list, runs: list[dict]) -> list[dict[str, Any]]:
    rows = []
    named_demos = [(f"demo{i}", demo) for i, demo in enumerate(demos)]
    for workload, plan in [*plans.items(), *named_demos]:
        for n, b in _profiled(plan) if not workload.startswith("demo") else [
                (plan.choice.num_workers, plan.choice.global_batch)]:
            mine = [r for r in runs if r["workload"] == workload and r["num_workers"] == n
                    and r["global_batch"] == b]
            if not mine:
                continue
            per_run = [statistics.median(r["epoch_seconds"][1:]) for r in mine]
            measured = statistics.median(per_run)
            row = plan.table[(plan.table["num_workers"] == n)
                             & (plan.table["global_batch"] == b)].iloc[0]
            predicted = float(row["measured_epoch_time_s"]) if np.isfinite(
                row.get("measured_epoch_time_s", np.nan)) else float(row["epoch_time_s"])
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


def _summary(rows: list[dict]) -> dict[str, Any]:
    """The goal's figures over the fp32 grid (as before bf16 joined it), bf16's beside."""
    grid = [abs(r["ratio"] - 1) for r in rows
            if not r["workload"].startswith("demo") and r["workload"] not in BF16_OF]
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


def _precision_ratios(rows: list[dict]) -> list[dict[str, Any]]:
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
