"""Issue 4 (and Table I of issue 5): test accuracy of the large-batch strategies.

Fashion-MNIST, a fixed 10k-image train subset, the full 10k test set, the small
CNN, 20 epochs. A reference run at B=32 (plain SGD) against B = 512, 1024 and 2048
(Table I's three large batches) trained with each registered strategy and the
paper's recipe: lbt, lrs, lars, polo, ags (Algorithm 1 literally: sub-batch source,
per-tensor scales, refreshed per epoch) and ags-ns (AGS-NS, the variant beyond the
paper, issue 12). Every run is data-parallel on N=2 gloo workers (the embedded
default's shape), so PoLo really goes local and the DDP-local gradient exists. Each
run is set up by `tula_ray.training.run.prepare_run` and each epoch is
`tula_ray.training.epochs.train_epoch`, the code `tula_ray.train()` runs on Ray.

Then each strategy tuned with the same budget (`benchmarks.training.tuning`: at B = 1024, carried
to 512 and 2048 by the strategy's own scaling rule) and trained with its tuned
configuration in the same way, label "<strategy> tuned" (not in --quick).

Runs are appended to a JSON-lines file as they finish, so an interrupted
benchmark keeps what it measured: `run` skips finished runs, and `report()` rebuilds
the tables from the runs so far (each row says over how many seeds). A label's
`RECIPE_VERSIONS` entry changes when its code changes behaviour: records of an older
version stay in the file but are neither reused nor reported.

This module trains the runs; what is run is `benchmarks.training.generalization_runs`'s, the
summary, goals, figure and markdown are `benchmarks.training.generalization_report`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any

from torch import nn

import benchmarks.training.tuning as tuning  # a sibling module, not the package face
from benchmarks.common import RESULTS_DIR, read_runs, spawn_gloo
from benchmarks.training.generalization_report import record, report
from benchmarks.training.generalization_runs import (EPOCHS, LARGE_BATCHES, NAME, STRATEGY_RUNS,
                                                     TRAIN_SUBSET, WORLD_SIZE, run_key, variant)

# A benchmark's module names its results and its report (the check that rebuilds every
# report from results/ reads them): this one's live beside its runs and its tables.
__all__ = ["NAME", "report", "run"]


def _run_one(run: dict[str, Any], rank: int) -> dict[str, Any]:
    from tula_ray.training.run import prepare_run
    from tula_ray.workloads import get_workload

    workload = get_workload("fashion-mnist-cnn", train_subset=run["train_subset"], subset_seed=0)
    if run.get("test_subset") is not None:  # --quick: the test set's first images only
        workload = dataclasses.replace(workload, test_dataset_fn=functools.partial(
            _test_images, run["test_subset"]))
    # The per-process setup `tula_ray.train()`'s workers and `fit` share.
    prepared = prepare_run(
        workload, global_batch=run["global_batch"], strategy=run["strategy"],
        epochs=run["epochs"], seed=run["seed"], options=run["options"], lr=run.get("lr"),
        num_replicas=WORLD_SIZE, rank=rank, budget=run.get("budget", "epochs"),
        wrap_model=nn.parallel.DistributedDataParallel)
    setup = prepared.setup
    history = []
    for epoch, metrics in prepared.train_epochs():
        history.append({k: v for k, v in metrics.items() if k != "variability"}
                      | {"epoch": epoch, "variability": metrics.get("variability")})
        if rank == 0:
            print(f"{run['label']} B={run['global_batch']} seed={run['seed']} epoch {epoch}: "
                  f"test {metrics['test_accuracy']:.4f}", flush=True)
    return {**run, "notes": list(setup.notes), "history": history,
            "test_accuracy": history[-1]["test_accuracy"]}


def _test_images(count: int):
    """Fashion-MNIST's first `count` test images as a TensorDataset."""
    from torch.utils.data import TensorDataset

    from tula_ray.workloads.datasets import fashion_mnist

    images, labels = fashion_mnist(train=False).tensors
    return TensorDataset(images[:count], labels[:count])


def run_on_rank(rank: int, runs: list[dict], out: str) -> None:
    """One gloo process's part of `runs` (`spawn_gloo`'s target): each run in turn, rank 0
    appending its result, with its wall time, to the JSON lines at `out`."""
    for run in runs:
        started = time.perf_counter()
        result = _run_one(run, rank)
        if rank == 0:
            result["wall_s"] = time.perf_counter() - started
            with open(out, "a") as stream:
                stream.write(json.dumps(result, default=float) + "\n")


def run(quick: bool = False, batches: tuple[int, ...] = LARGE_BATCHES) -> dict:
    """The recipe runs, then (not in --quick) the tunings, then the tuned runs; each step
    skips what its log already records."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _, _, _, log = variant(quick, batches)
    if quick and log.exists():
        log.unlink()
    _run_missing(quick, batches, recipe_only=True)
    if not quick:
        tuning.tune_missing(STRATEGY_RUNS, world_size=WORLD_SIZE, train_subset=TRAIN_SUBSET,
                            epochs=EPOCHS)
        _run_missing(quick, batches, recipe_only=False)
    return record(quick, batches)


def _run_missing(quick: bool, batches: tuple[int, ...], recipe_only: bool) -> None:
    _, _, runs, log = variant(quick, batches)
    done = {run_key(r) for r in read_runs(log)}
    todo = [r for r in runs if run_key(r) not in done
            and not (recipe_only and "tuned_at" in r)]
    if todo:
        spawn_gloo(run_on_rank, WORLD_SIZE, todo, str(log))
