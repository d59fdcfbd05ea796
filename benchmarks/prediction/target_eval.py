"""A run to a target's evaluations, the plan's price against `train`'s (issue 43, item 1:
the evaluation's cost is part of the plan's time to accuracy).

`train(target_accuracy=)` scores a validation split about every quarter epoch and the
test set once; the plan priced a test pass per epoch until 2026-11-29, and now prices
the validation passes from the profiled test pass by their samples
(`tula_ray.planning.target_costs`). The protocol, fixed here before the first recorded
run: a full search of the CNN on Fashion-MNIST's 60k training images and 10k test images
(the demo's sizes), N in {1, 2}, B in 32..512, plain SGD ("lbt"); then at every (N, B) of
`CELLS`, `REPEATS` interleaved runs of `train(plan, target_accuracy=TARGET)` (a target no
run reaches, so every epoch evaluates on schedule) for `EPOCHS` epochs, with train's
defaults (a 10 % split, a pass every quarter epoch). Per cell, the median over runs of
epochs 2-3's `val_seconds` (the epoch's validation passes; the first epoch warms up)
against the plan's validation seconds per epoch of the run (`TargetEvaluations`) and
against the test pass per epoch it charged before. Every run is appended to
target_eval.runs.jsonl as it ends (a session that stops goes on from it); the plan is
kept beside it. `--quick`: one worker, B = 128, a 2048-image subset, one run of 2 epochs.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from typing import Any

from benchmarks.common import Benchmark, markdown_table, provenance, read_runs

NAME = "target_eval"
TARGET = 0.999  # reached by no run here: every epoch's evaluations happen on schedule
REPEATS = 3
EPOCHS = 3  # epochs 2-3 compared
FULL = {"train_subset": None, "cluster_sizes": (1, 2), "batches": (32, 512),
        "cells": ((1, 32), (1, 512), (2, 32), (2, 512)), "repeats": REPEATS, "epochs": EPOCHS}
QUICK = {"train_subset": 2048, "cluster_sizes": (1,), "batches": (128, 128),
         "cells": ((1, 128),), "repeats": 1, "epochs": 2}


def predicted(plan, num_workers: int, global_batch: int) -> dict[str, float]:
    """The plan's validation seconds per epoch of the run at (N, B), and the test pass
    per epoch it charged before (its `eval_time_s` there)."""
    from tula_ray.planning.target_costs import TargetEvaluations

    row = plan.table[(plan.table["num_workers"] == num_workers)
                     & (plan.table["global_batch"] == global_batch)].iloc[0]
    evaluations = TargetEvaluations.from_profiles(plan.profiles, plan.dataset_size)
    if evaluations is None:
        raise RuntimeError("the plan's profiles hold no pass's samples: searched before "
                           "2026-11-29?")
    passes = evaluations.per_run_epoch(evaluations.passes_per_epoch(global_batch))
    return {"passes": float(passes), "validation_size": evaluations.validation_size,
            "plan_s": float(evaluations.per_run_epoch(evaluations.validation_s(
                float(row["eval_time_s"]), global_batch))),
            "before_s": float(row["eval_time_s"])}


def _run_once(plan, cell: tuple[int, int], settings: dict, storage: str) -> dict[str, Any]:
    from tula_ray import train

    choice = dataclasses.replace(plan.choice, num_workers=cell[0], global_batch=cell[1])
    result = train(dataclasses.replace(plan, choice=choice), "lbt", epochs=settings["epochs"],
                   workload_options=_options(settings),
                   target_accuracy=TARGET, storage_path=storage)
    return {"val_seconds": [float(s) for s in result.metrics["val_seconds"]],
            "epoch_seconds": [float(s) for s in result.metrics["seconds"]]}


def run(quick: bool = False) -> dict:
    from tula_ray import search
    from tula_ray.cluster import ray_session
    from tula_ray.planning.plan import Plan

    settings = QUICK if quick else FULL
    benchmark = Benchmark(NAME, quick)
    runs_path, plan_path = benchmark.log(), benchmark.path(".plan.json")
    if quick:
        plan_path.unlink(missing_ok=True)
    runs = read_runs(runs_path)
    storage = tempfile.mkdtemp(prefix="tula-target-eval-")
    with ray_session(None, None):
        if plan_path.exists():
            plan = Plan.from_json(plan_path)
        else:
            plan = search("fashion-mnist-cnn", workload_options=_options(settings),
                cluster_sizes=settings["cluster_sizes"], min_batch=settings["batches"][0],
                max_batch=settings["batches"][1], search_strategy="full",
                training_strategy="lbt", epochs=settings["epochs"])
            plan.to_json(plan_path)
        for repeat in range(settings["repeats"]):  # the cells interleaved, repeat by repeat
            for cell in settings["cells"]:
                if any(r["repeat"] == repeat and tuple(r["cell"]) == cell for r in runs):
                    continue
                record = {"cell": list(cell), "repeat": repeat,
                          **_run_once(plan, cell, settings, storage),
                          "commit": provenance()["commit"]}
                with runs_path.open("a") as stream:
                    stream.write(json.dumps(record) + "\n")
                runs.append(record)
    rows = [{"num_workers": n, "global_batch": b, **predicted(plan, n, b),
             "train_s": _measured(runs, (n, b)), "runs": sum(
                 tuple(r["cell"]) == (n, b) for r in runs)} for n, b in settings["cells"]]
    return benchmark.record({"settings": {**settings, "target": TARGET},
                             "rows": rows}, report)


def _options(settings: dict) -> dict | None:
    subset = settings["train_subset"]
    return None if subset is None else {"train_subset": subset}


def _measured(runs: list[dict], cell: tuple[int, int]) -> float:
    """The median over runs of each run's median validation seconds in its epochs after
    the first."""
    return statistics.median(statistics.median(r["val_seconds"][1:]) for r in runs
                             if tuple(r["cell"]) == cell)


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = result["rows"]
    body = [[r["num_workers"], r["global_batch"], f"{r['passes']:.2f}", r["runs"],
             f"{r['train_s']:.3f}", f"{r['plan_s']:.3f}", f"{r['plan_s'] / r['train_s']:.2f}",
             f"{r['before_s']:.3f}", f"{r['before_s'] / r['train_s']:.2f}"] for r in rows]
    errors = {key: [abs(r[f"{key}_s"] / r["train_s"] - 1) for r in rows]
              for key in ("plan", "before")}
    return "\n".join([
        "### A run to a target's evaluations: the plan's price against `train`'s "
        "(issue 43)\n",
        f"`{result['command']}` at {result['commit']}, {result['date']}, "
        f"{result['machine']}.\n",
        "The CNN on Fashion-MNIST's " + ("60000" if s["train_subset"] is None else
                                         f"first {s['train_subset']}")
        + " training images (the 10000 test images), a full "
        f"search (plain SGD), then at each (N, B) {s['repeats']} interleaved run(s) of "
        f"`train(plan, target_accuracy={s['target']})` for {s['epochs']} epochs, with train's "
        f"defaults (a {rows[0]['validation_size']}-image validation split scored about "
        "every quarter epoch; no run reaches the target). `train s`: an epoch's validation "
        "passes (`val_seconds`), median over epochs 2 on and over runs; `plan s`: the plan's "
        "validation passes per epoch of the run (priced from the profiled test pass by "
        "samples); `before s`: the test pass per epoch the plan charged until 2026-11-29.\n",
        markdown_table(["N", "B", "passes / epoch", "runs", "train s", "plan s",
                        "plan / train", "before s", "before / train"], body), "",
        *(f"- {label}: median |ratio - 1| = {statistics.median(errors[key]):.1%}, worst "
          f"{max(errors[key]):.1%}." for key, label in (
              ("plan", "The plan's price"), ("before", "A test pass per epoch (before)"))),
        ""])
