"""Issue 24 figures: does the plan predict the epochs that `tula_ray.train` runs?

For each workload, a full search (`tula_ray.search(search_strategy="full")`, plain SGD "lbt",
N in {1, 2}) writes a plan; then every profiled (N, B) is trained with `tula_ray.train`
for 3 epochs; `REPEATS` times, each repeat a new search followed by one run of every
candidate (the runs interleaved), and the median `seconds` of epochs 2-3 (the first one
warms up) is set beside the plan's `epoch_time_s`, which was written before its runs and
is never refitted on them. The headline is the first search's plan against the median of
every run, as before; beside it each search's plan, against the median of every run and
against the runs that followed it, and the plans' own spread per cell: one search's
noise next to the runs'. Then the demo's own plan (the
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
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, Benchmark, provenance, read_runs
from benchmarks.prediction.train_time_compare import (add_plan_spread, compare, each_search,
                                                      median_plan_errors, precision_ratios,
                                                      profiled, summary)
from benchmarks.prediction.train_time_report import report

# Three runs per cell: the median of three resists one slow run, which two (their mean)
# do not; the machine's runs of one cell differ by up to 20 % (NOTES-ENV).
NAME = "train_time"
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
# The smoke test: one worker, one batch, two epochs (the second one is compared).
QUICK_WORKLOADS = (("fashion-mnist-cnn", "fashion-mnist-cnn", {"train_subset": 1024},
                    (256, 256), (256,)),)
QUICK_EPOCHS = 2


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


def plan_path(name: str, label: str, repeat: int = 0) -> Path:
    """Where repeat `repeat`'s plan of `label` is kept (the first repeat's: as before)."""
    suffix = "" if repeat == 0 else f".r{repeat}"
    return RESULTS_DIR / f"{name}_{label}{suffix}.plan.json"


def run(quick: bool = False, plans: dict[str, Any] | None = None) -> dict:
    """plans: with quick, the plan of each quick workload's label, given instead of
    searched (a smoke test of what follows the search: the runs and the report)."""
    import tempfile

    from tula_ray.cluster import ray_session

    benchmark = Benchmark(NAME, quick)
    name = benchmark.output
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    runs_path = benchmark.path(".runs.jsonl")
    if quick:  # a smoke test starts afresh; the full run goes on from what it recorded
        for stale in RESULTS_DIR.glob(f"{name}*"):
            stale.unlink()
    runs = read_runs(runs_path)
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    repeats = 1 if quick else REPEATS
    epochs = QUICK_EPOCHS if quick else EPOCHS
    sizes = (1,) if quick else (1, 2)
    storage = tempfile.mkdtemp(prefix="tula-train-time-")
    searches: list[dict] = []  # per repeat: {label: the plan searched just before its runs}
    with ray_session(None, None):
        for repeat in range(repeats):
            # A new search per repeat, just before the runs it is set beside: the plan's
            # own spread shows, and a slow drift of the machine falls on plan and runs alike.
            searched = plans if quick and plans is not None else {label: _plan(
                plan_path(name, label, repeat), workload=workload,
                workload_options=options or None, cluster_sizes=sizes, min_batch=low,
                max_batch=high, search_strategy="full", training_strategy="lbt", epochs=epochs)
                for label, workload, options, (low, high), _ in workloads}
            searches.append(searched)
            for label, _, options, _, trained in workloads:
                plan = searched[label]
                for n, b in [(n, b) for n, b in profiled(plan) if b in trained]:
                    _measure({"workload": label, "num_workers": n, "global_batch": b,
                              "strategy": "lbt", "repeat": repeat}, runs, runs_path, plan,
                             "lbt", options, storage, epochs)
        demos = []
        for repeat in range(0 if quick else DEMO_REPEATS):
            demo = _plan(plan_path(name, f"demo{repeat}"),
                         workload="fashion-mnist-cnn", cluster_sizes=(1, 2), min_batch=32,
                         max_batch=2048)
            strategy = demo.meta["training_strategy"]  # what `train(plan)` runs by default
            _measure({"workload": f"demo{repeat}", "num_workers": demo.choice.num_workers,
                      "global_batch": demo.choice.global_batch, "strategy": strategy,
                      "repeat": 0}, runs, runs_path, demo, strategy, {}, storage)
            demos.append(demo)
    # The headline: the first search's plan against the median of every run, as before.
    rows = compare(searches[0], demos, runs)
    result = {"epochs": epochs, "repeats": repeats,
              "demo_repeats": len(demos), "rows": rows, "run_commits": _run_commits(runs),
              "searches": each_search(searches, runs)}
    add_plan_spread(rows, searches)
    if demos:
        result["demo_profiling_wall_s"] = [d.meta.get("profiling_wall_s") for d in demos]
        result["demo_launches"] = [d.meta.get("launches") for d in demos]
    result["summary"] = summary(rows)
    result["median_plan"] = median_plan_errors(rows)
    result["precision"] = precision_ratios(rows)
    if repeats > 2:  # what the earlier two-run grid would say of these same runs
        result["summary_two_runs"] = summary(
            compare(searches[0], demos, [r for r in runs if r["repeat"] < 2]))
    return benchmark.record(result, report, nested=True)


def _run_commits(runs: list[dict]) -> dict[str, dict[str, int]]:
    """{"grid" | "demo": {commit: runs}}: the trees the recorded runs trained at (runs
    recorded before commits were kept count as "not recorded")."""
    counts: dict[str, Counter] = {"grid": Counter(), "demo": Counter()}
    for run in runs:
        counts["demo" if run["workload"].startswith("demo") else "grid"][
            run.get("commit", "not recorded")] += 1
    return {part: dict(counted) for part, counted in counts.items()}
