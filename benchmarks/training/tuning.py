"""Issue 12 item 6, the tuned half of the Table I analog: every strategy tuned with the
same budget, then trained with its tuned configuration like the recipe runs.

Tuning at every B does not fit this machine, so each strategy is tuned once, at
B = 1024 on the generalization benchmark's N = 2 (`tula_ray.tune_training`: Optuna's
TPE and ASHA on Ray Tune, the same `TRIALS` for every strategy, every trial judged on
a share of the TRAINING subset held out; the test set stays untouched). Its best
configuration is carried to B = 512 and 2048 unchanged: `lr` is the learning rate before
each strategy's own rule (lrs and lars scale it by B / 128; lbt and polo keep it; the AGS
variants keep it and scale the gradient instead, by at most their s_max), so carrying it
is the strategy's own rule.

Resumes: each strategy's tuning is appended to `generalization.tuned.jsonl` when it
finishes (an interrupted tuning starts over: its trials are not kept); the final runs
go to the recipe runs' log and resume with it (`benchmarks.training.generalization`).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import RESULTS_DIR

TUNE_BATCH = 1024  # issue 12: tune at B = 1024, carry to 512 and 2048
TRIALS = 12  # the same budget for every strategy
TUNED_LOG = RESULTS_DIR / "generalization.tuned.jsonl"
TUNED_SUFFIX = " tuned"  # label of a strategy's runs with its tuned configuration


def tuning_plan(world_size: int, global_batch: int, train_subset: int, epochs: int):
    """A plan whose choice is (world_size, global_batch) for the benchmark's CNN and
    subset: `tune_training` tunes at a plan's choice. Its step times are synthetic
    (`tula_ray.planning.synthetic`): tuning reads only the workload, its options, N, B and E."""
    from tula_ray.planning.context import PlanContext
    from tula_ray.planning.plan import build_plan
    from tula_ray.planning.policy import Choice
    from tula_ray.space import SearchSpace
    from tula_ray.planning.synthetic import example_params, synthetic_profiles

    space = SearchSpace((1, world_size), (32, global_batch))
    profiles = synthetic_profiles(space.candidates(), example_params())
    context = PlanContext(epochs=epochs, dataset_size=train_subset, workload="fashion-mnist-cnn")
    plan = build_plan(space, profiles, context, search_strategy="full",
                      meta={"workload_options": {"train_subset": train_subset,
                                                 "subset_seed": 0}})
    return dataclasses.replace(plan, choice=Choice(
        world_size, global_batch, plan.objective, "Table I analog: tuned at this (N, B)"))


def read_tuned(path: Path = TUNED_LOG) -> dict[str, dict[str, Any]]:
    """Recorded tunings by label (the last record of a label wins)."""
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {record["label"]: record for record in records}


def tune_missing(strategies: dict[str, tuple[str, dict]], *, world_size: int, train_subset: int,
                 epochs: int, trials: int = TRIALS, global_batch: int = TUNE_BATCH,
                 path: Path = TUNED_LOG,
                 tune: Callable[..., Any] | None = None) -> dict[str, dict[str, Any]]:
    """Tune every strategy of `strategies` (label -> (strategy, recipe options)) that
    `path` does not record yet, recording each as it finishes; returns every record.
    tune: `tula_ray.tune_training` (a test passes its own)."""
    if tune is None:
        from tula_ray.runs.tune_training import tune_training as tune
    done = read_tuned(path)
    plan = tuning_plan(world_size, global_batch, train_subset, epochs)
    for label, (strategy, options) in strategies.items():
        if label in done and done[label]["trials"] == trials:
            continue
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="tula-tuning-") as storage:
            result = tune(plan, strategy, trials=trials, epochs=epochs, seed=0,
                          storage_path=storage)
        config = dict(result.config)
        config["strategy_options"] = {**options, **config.get("strategy_options", {})}
        record = {"label": label, "strategy": strategy, "global_batch": global_batch,
                  "world_size": world_size, "trials": trials, "epochs": epochs,
                  "lr": config["lr"], "strategy_options": config["strategy_options"],
                  "val_accuracy": result.val_accuracy,
                  "trials_run": int(len(result.trials)),
                  "wall_s": time.perf_counter() - started}
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as stream:
            stream.write(json.dumps(record, default=float) + "\n")
        done[label] = record
    return {label: done[label] for label in strategies if label in done}


def tuned_runs(tuned: dict[str, dict[str, Any]], common: dict[str, Any],
               batches) -> list[dict[str, Any]]:
    """The final runs of the tuned configurations at each B (one seed's, `common`)."""
    return [{**common, "label": label + TUNED_SUFFIX, "strategy": record["strategy"],
             "options": record["strategy_options"], "lr": record["lr"],
             "global_batch": batch, "tuned_at": record["global_batch"]}
            for label, record in tuned.items() for batch in batches]
