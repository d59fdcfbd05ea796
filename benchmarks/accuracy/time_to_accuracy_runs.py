"""The time-to-accuracy benchmark's ground truth (`benchmarks.accuracy.time_to_accuracy`): its
settings, the training runs (each B and seed on two gloo workers, scored on the held-out
split after every epoch), the epochs and seconds each run took to a target, and `train`'s
own step times, the clock the goals are judged on."""

from __future__ import annotations

import json
import math
import statistics
import time
from typing import Any

from torch import nn

from benchmarks.common import rotated_schedule

NAME = "time_to_accuracy"
WORLD_SIZE = 2  # the demo grid's N = 2 row
STRATEGY = "ags-ns"  # the plan's default training strategy (what `train` runs)
REFERENCE_BATCH = 32
# held_out: the training images after the subset's, scored after every epoch.
FULL = {"train_subset": 10_000, "held_out": 10_000,
        "batches": (32, 64, 128, 256, 512, 1024, 2048), "seeds": (0, 1, 2, 3, 4),
        "targets": (0.82, 0.86, 0.87), "max_epochs": 100, "searches": 3}
# --quick: its phi measurements train on for an epoch of the subset, so a small one. On 2
# CPUs (2026-11-28) B = 128 scored 30 and 50 % after its 2nd and 3rd epochs of 4 steps, the
# last target 45 %: 5 epochs leave room.
QUICK = {"train_subset": 512, "held_out": 512, "batches": (32, 128), "seeds": (0,),
         "targets": (0.30, 0.45), "max_epochs": 5, "searches": 1}
TEST_SIZE = 10_000  # Fashion-MNIST's test set: what the profile's evaluation pass scored
# `tula_ray.train` per B for `train`'s clock: epochs per run (the first, with its warm-up,
# left out) and runs per B, interleaved.
TRAIN_TIMED = {"epochs": 3, "repeats": 2}


# --------------------------------------------------------------------------- ground truth

def plan_runs(settings: dict) -> list[dict[str, Any]]:
    """Seeds in turn; within a seed the batches rotate so no batch always runs first."""
    return [{"global_batch": batch, "seed": seed, "strategy": STRATEGY,
             "train_subset": settings["train_subset"], "held_out": settings["held_out"],
             "max_epochs": settings["max_epochs"], "stop_at": max(settings["targets"])}
            for seed, batch in rotated_schedule(settings["seeds"], settings["batches"])]


def run_key(run: dict) -> tuple:
    return (run["global_batch"], run["seed"], run["train_subset"], run.get("held_out"),
            run["max_epochs"], run["stop_at"])


def held_out_workload(train_subset: int, held_out: int):
    """The CNN on Fashion-MNIST's first `train_subset` training images, evaluated on the
    `held_out` images after them: a user's Workload, the built-in's with its test set
    replaced."""
    import dataclasses
    import functools

    from tula_ray.workloads import get_workload

    workload = get_workload("fashion-mnist-cnn", train_subset=train_subset)
    return dataclasses.replace(workload, test_dataset_fn=functools.partial(
        training_images, train_subset, train_subset + held_out))


def training_images(start: int, stop: int):
    """Fashion-MNIST's training images [start, stop) as a TensorDataset."""
    from torch.utils.data import TensorDataset

    from tula_ray.workloads.datasets import fashion_mnist

    images, labels = fashion_mnist(train=True).tensors
    return TensorDataset(images[start:stop], labels[start:stop])


def train_worker(rank: int, runs: list[dict], out: str) -> None:
    from tula_ray.training.run import prepare_run

    for run in runs:
        started = time.perf_counter()
        prepared = prepare_run(
            held_out_workload(run["train_subset"], run["held_out"]),
            global_batch=run["global_batch"], strategy=run["strategy"],
            epochs=run["max_epochs"], seed=run["seed"], num_replicas=WORLD_SIZE, rank=rank,
            wrap_model=nn.parallel.DistributedDataParallel)
        history = []
        for epoch, metrics in prepared.train_epochs():
            history.append({"epoch": epoch, "val_accuracy": metrics["test_accuracy"],
                            "seconds": metrics["seconds"],
                            "eval_seconds": metrics["eval_seconds"]})
            if metrics["test_accuracy"] >= run["stop_at"]:  # the same on every rank
                break
        if rank == 0:
            record = {**run, "history": history, "wall_s": time.perf_counter() - started}
            with open(out, "a") as stream:
                stream.write(json.dumps(record, default=float) + "\n")


def to_target(history: list[dict], target: float) -> tuple[float, float]:
    """(epochs, seconds) of training and evaluation until the validation accuracy first
    reaches `target`, interpolated linearly within the epoch that crosses it; (inf, inf)
    when it never does."""
    previous_accuracy, seconds = 0.0, 0.0
    for done, point in enumerate(history):
        spent = point["seconds"] + point["eval_seconds"]
        if point["val_accuracy"] >= target:
            share = (target - previous_accuracy) / max(point["val_accuracy"] - previous_accuracy,
                                                       1e-12)
            share = min(max(share, 0.0), 1.0)
            return done + share, seconds + share * spent
        previous_accuracy, seconds = point["val_accuracy"], seconds + spent
    return math.inf, math.inf


def measured(runs: list[dict], targets) -> dict[float, dict[int, dict[str, float]]]:
    """Per target and B: the median over the seeds of the epochs and seconds to it."""
    table: dict[float, dict[int, dict[str, float]]] = {}
    for target in targets:
        by_batch: dict[int, list[tuple[float, float]]] = {}
        for r in runs:
            by_batch.setdefault(r["global_batch"], []).append(to_target(r["history"], target))
        table[target] = {b: {"epochs": statistics.median(e for e, _ in pairs),
                             "seconds": statistics.median(s for _, s in pairs),
                             "seeds": len(pairs),
                             "reached": sum(math.isfinite(e) for e, _ in pairs)}
                         for b, pairs in sorted(by_batch.items())}
    return table


# --------------------------------------------------------------------------- train's clock

def whole_steps(size: int, global_batch: int) -> int:
    """Optimizer steps in an epoch of `size` samples (per-rank shares, drop_last)."""
    return (size // WORLD_SIZE) // (global_batch // WORLD_SIZE)


def train_timings(plan, settings: dict, log) -> list[dict[str, Any]]:
    """`tula_ray.train` of every B (the plan with it as its choice), `TRAIN_TIMED` runs
    each, repeats in turn and the batches' order rotating; each run's epochs' `seconds`,
    appended to `log` as it ends (a resumed benchmark reuses them)."""
    import dataclasses
    import tempfile

    from tula_ray import train

    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] \
        if log.exists() else []
    batches = list(settings["batches"])
    for repeat in range(TRAIN_TIMED["repeats"]):
        shift = repeat % len(batches)
        for batch in batches[shift:] + batches[:shift]:
            key = {"global_batch": batch, "repeat": repeat,
                   "train_subset": settings["train_subset"], "epochs": TRAIN_TIMED["epochs"]}
            if any(all(r.get(k) == v for k, v in key.items()) for r in records):
                continue
            chosen = dataclasses.replace(plan, choice=dataclasses.replace(
                plan.choice, num_workers=WORLD_SIZE, global_batch=batch))
            with tempfile.TemporaryDirectory(prefix="tula-tta-train-") as storage:
                result = train(chosen, STRATEGY, epochs=TRAIN_TIMED["epochs"],
                               workload_options={"train_subset": settings["train_subset"]},
                               storage_path=storage)
            record = {**key, "epoch_seconds": [float(x) for x in result.metrics["seconds"]]}
            with open(log, "a") as stream:
                stream.write(json.dumps(record) + "\n")
            records.append(record)
            print(f"train at B = {batch}, repeat {repeat}: epochs "
                  + ", ".join(f"{x:.2f}" for x in record["epoch_seconds"]) + " s", flush=True)
    return records


def train_step_seconds(records: list[dict], train_subset: int) -> dict[int, dict[str, float]]:
    """Per B: `train`'s seconds per step (each run's median over its epochs after the
    first, over the epoch's whole steps), the median over the runs and their spread
    ((max - min) / median)."""
    by_batch: dict[int, list[float]] = {}
    for r in records:
        if r["train_subset"] != train_subset:
            continue
        steps = whole_steps(train_subset, r["global_batch"])
        by_batch.setdefault(r["global_batch"], []).append(
            statistics.median(r["epoch_seconds"][1:] or r["epoch_seconds"]) / steps)
    return {b: {"step_s": statistics.median(v),
                "spread": (max(v) - min(v)) / statistics.median(v), "runs": len(v)}
            for b, v in sorted(by_batch.items())}


def loop_step_seconds(runs: list[dict], train_size: int) -> dict[int, dict[str, float]]:
    """--quick's stand-in for `train_step_seconds`: the loop's own seconds per step."""
    by_batch: dict[int, list[float]] = {}
    for r in runs:
        by_batch.setdefault(r["global_batch"], []).extend(
            p["seconds"] / whole_steps(train_size, r["global_batch"]) for p in r["history"])
    return {b: {"step_s": statistics.median(v), "spread": 0.0, "runs": 0}
            for b, v in sorted(by_batch.items())}


def on_train_clock(truth: dict[int, dict[str, float]], runs: list[dict],
                   steps: dict[int, dict[str, float]], train_size: int) -> None:
    """Adds `train_seconds` to each B of one target's `truth`: the measured epochs to the
    target x (the training split's whole steps at `train`'s step + the loop's median
    held-out evaluation at that B); NaN where `train` was not timed at that B."""
    for batch, row in truth.items():
        evals = [p["eval_seconds"] for r in runs if r["global_batch"] == batch
                 for p in r["history"]]
        per_epoch = (whole_steps(train_size, batch) * steps[batch]["step_s"]
                     + statistics.median(evals)) if batch in steps and evals else math.nan
        row["train_seconds"] = row["epochs"] * per_epoch
