"""python -m benchmarks time-to-accuracy-v2 (issue 43, item 4): the time-to-accuracy benchmark
re-run with `tula_ray.train` stopping at each target.

Everything the comparison rests on (data, targets, seeds, batches, the evaluation interval,
the time measured, the bootstrap) is `benchmarks.accuracy.time_to_accuracy_protocol`, fixed
before any run; this module only carries it out. In one Ray session: the protocol's
searches (each a new `tula_ray.search` of the CNN on the protocol's training images, saved
as it ends), then every B on every seed, each one `tula_ray.train` of the first search's
plan with B as its choice, to the last target, evaluating the validation images every
`EVAL_EVERY_SAMPLES` samples; the earlier targets are read from the same run's evaluations.
Seeds in turn, the batches' order rotating. Each run is appended to
results/time_to_accuracy_v2.runs.jsonl as it ends, and a rerun skips what the log records
(resumable across sessions). The judging is `time_to_accuracy_v2_report`'s.

--quick: 512 training and 512 validation images, one batch, one seed, low targets, a plan
from synthetic profiles (no search), written to time_to_accuracy_v2_quick.* (git-ignored):
a smoke test of the runner on Ray, not a measurement.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.accuracy.time_to_accuracy_protocol import (
    BATCHES, BOOTSTRAP, EVAL_EVERY_SAMPLES, MAX_EPOCHS, PROTOCOL_VERSION, REFERENCE_BATCH,
    RESULTS_NAME, SEARCHES, SEEDS, STRATEGY, TARGETS, TIME_MEASURE, TRAIN_IMAGES,
    VALIDATION_IMAGES, WORKLOAD, WORLD_SIZE)
from benchmarks.accuracy.adaptive_batch import target_run_fields, with_batch
from benchmarks.accuracy.time_to_accuracy import kept_plan
from benchmarks.accuracy.time_to_accuracy_runs import training_images
from benchmarks.accuracy.time_to_accuracy_v2_report import judged_targets, report
from benchmarks.common import Benchmark, read_runs, rotated_schedule

NAME = RESULTS_NAME


@dataclasses.dataclass(frozen=True)
class Settings:
    """The protocol's values (or the smoke test's) as one run uses them."""

    train_images: int
    validation_images: int
    targets: tuple[float, ...]
    seeds: tuple[int, ...]
    batches: tuple[int, ...]
    eval_every_samples: int
    max_epochs: int
    searches: int


FULL = Settings(TRAIN_IMAGES, VALIDATION_IMAGES, TARGETS,
                SEEDS, BATCHES, EVAL_EVERY_SAMPLES,
                MAX_EPOCHS, SEARCHES)
# The smoke test: one run (a `train` launch is about a minute on 2 CPUs), one search-free plan.
QUICK = Settings(512, 512, (0.30, 0.45), (SEEDS[0],), (32,), 256, 3, 1)


# --------------------------------------------------------------------------- data

def protocol_workload(settings: Settings):
    """The CNN on Fashion-MNIST's first training images, its own validation split the
    images after them (`val_dataset_fn`), Fashion-MNIST's test set for the final score."""
    from tula_ray.workloads import get_workload

    train, val = settings.train_images, settings.validation_images
    return dataclasses.replace(
        get_workload(WORKLOAD), train_size=train,
        train_dataset_fn=functools.partial(training_images, 0, train),
        val_dataset_fn=functools.partial(training_images, train, train + val))


# --------------------------------------------------------------------------- the runs

def run_specs(settings: Settings) -> list[dict[str, Any]]:
    """Every B on every seed: seeds in turn, the batches' order rotating (no B always
    runs first after the machine idled)."""
    return [{"batch": b, "seed": seed, "version": PROTOCOL_VERSION}
            for seed, b in rotated_schedule(settings.seeds, settings.batches)]


def run_key(spec: dict[str, Any]) -> tuple:
    return spec["batch"], spec["seed"], spec["version"]


def train_run(spec: dict[str, Any], settings: Settings, plan) -> dict[str, Any]:
    """One `tula_ray.train` to the last target; its record (what the report reads)."""
    import tula_ray

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tula-tta-v2-") as storage:
        result = tula_ray.train(
            with_batch(plan, spec["batch"], WORLD_SIZE), STRATEGY,
            workload=protocol_workload(settings), epochs=settings.max_epochs,
            target_accuracy=max(settings.targets),
            eval_every_samples=settings.eval_every_samples, seed=spec["seed"],
            storage_path=storage, verbose=0)
        fields = target_run_fields(result)
    return {**spec, **fields, "target": dict(result.target),
            "wall_s": time.perf_counter() - started}


def run_missing(specs: list[dict], settings: Settings, plan, log: Path) -> None:
    """Trains the specs `log` does not record yet, appending each record as it ends."""
    done = {run_key(r) for r in read_runs(log)}
    for spec in specs:
        if run_key(spec) in done:
            continue
        record = train_run(spec, settings, plan)
        with open(log, "a") as stream:
            stream.write(json.dumps(record, default=float) + "\n")
        done.add(run_key(spec))
        print(f"B={spec['batch']} seed {spec['seed']}: {record['wall_s']:.0f} s, "
              f"{len(record['evaluations'])} evaluations", flush=True)


def protocol_record(settings: Settings) -> dict[str, Any]:
    """The protocol as the report reads it: the settings and the fixed design."""
    return {**dataclasses.asdict(settings), "version": PROTOCOL_VERSION,
            "workload": WORKLOAD, "world_size": WORLD_SIZE,
            "strategy": STRATEGY, "reference_batch": REFERENCE_BATCH,
            "time_measure": TIME_MEASURE,
            "bootstrap": dataclasses.asdict(BOOTSTRAP)}


def run(quick: bool = False) -> dict:
    from tula_ray.cluster import ray_session

    settings = QUICK if quick else FULL
    benchmark = Benchmark(NAME, quick)
    log = benchmark.log()
    with ray_session(None, None):
        # The searches first (each saved as it ends): the runs train the first one's plan.
        # What the plan is asked: v1's search (the training images only, no validation).
        plans = [kept_plan(benchmark.path(f".plan{i or ''}.json"), settings.batches,
                           settings.train_images, quick) for i in range(settings.searches)]
        run_missing(run_specs(settings), settings, plans[0], log)
    runs = [r for r in read_runs(log) if r["version"] == PROTOCOL_VERSION]
    record = protocol_record(settings)
    return benchmark.record({"quick": quick, "protocol": record, "runs": runs,
                             "searches": judged_targets(plans, runs, record)}, report,
                            nested=True)
