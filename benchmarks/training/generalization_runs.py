"""The generalization benchmark's runs (`benchmarks.training.generalization`): the strategies'
recipes, the runs planned (reference, recipes, ablations, tuned configurations), and the key
under which a finished run is reused (the runs' log: `benchmarks.common.resumable`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import benchmarks.training.tuning as tuning  # a sibling module, not the package face
from benchmarks.common import RESULTS_DIR

NAME = "generalization"
WORLD_SIZE = 2
REFERENCE_BATCH = 32  # NOTES-ENV: the best-generalising batch here
TRAIN_SUBSET, EPOCHS, SEEDS = 10_000, 20, (0, 1, 2)  # issue 4's setup
LARGE_BATCHES = (512, 1024, 2048)  # issue 5: Table I's three large batches per model
# --quick, a smoke test: one epoch of 2 steps at its large B and 32 at the reference's, scored
# on the test set's first 1000 images (scoring all 10k took most of its time).
QUICK = {"train_subset": 1024, "epochs": 1, "seeds": (0,), "batches": (512,),
         "test_subset": 1000}
STRATEGY_RUNS = {  # label -> (strategy, options): each strategy's paper recipe (its defaults)
    "lbt": ("lbt", {}),
    "lrs": ("lrs", {}),
    "lars": ("lars", {}),
    "polo": ("polo", {}),
    "ags": ("ags", {}),
    "ags-ns": ("ags-ns", {}),
}
# Ablations of a recipe, beside it in the table (not tuned, not among the goals' labels):
# AGS-NS with the paper's gain exponent 1/2 (its recipe until issue 12's re-run).
ABLATION_RUNS = {"ags-ns p=1/2": ("ags-ns", {"gain_exponent": 0.5})}
# Records before versions count as 1. ags 2: Algorithm 1 exact (issue 12: scales from the
# next step, BatchNorm untouched; the old records applied them one step early). ags-ns 2:
# AdaScale's gain exponent 1 (version 1 had the paper's 1/2).
RECIPE_VERSIONS = {"ags": 2, "ags-ns": 2}


def plan_runs(train_subset: int, epochs: int, seeds, batches,
              tuned: dict[str, dict] | None = None, quick: bool = False,
              test_subset: int | None = None) -> list[dict[str, Any]]:
    """The recipe runs (and, unless `quick`, the ablations'), then the tuned configurations'
    (`tuned`: recorded tunings); test_subset: score on the test set's first images only."""
    runs, recipes = [], STRATEGY_RUNS | ({} if quick else ABLATION_RUNS)
    scored = {} if test_subset is None else {"test_subset": test_subset}
    for seed in seeds:
        common = {"train_subset": train_subset, "epochs": epochs, "seed": seed, **scored}
        runs.append({**common, "label": "reference", "strategy": "lbt", "options": {},
                     "global_batch": REFERENCE_BATCH})
        for batch in batches:
            for label, (strategy, options) in recipes.items():
                runs.append({**common, "label": label, "strategy": strategy, "options": options,
                             "global_batch": batch, "version": RECIPE_VERSIONS.get(label, 1)})
    # The tuned runs batch by batch, the tuning's batch first: a session that ends mid-way
    # leaves whole rows (every strategy, every seed) of the batch the goals weigh most.
    for batch in sorted(batches, key=lambda b: (b != tuning.TUNE_BATCH, b)):
        for seed in seeds:
            common = {"train_subset": train_subset, "epochs": epochs, "seed": seed}
            runs += [{**run, "version": _config_version(run)}
                     for run in tuning.tuned_runs(tuned or {}, common, (batch,))]
    return runs


def _config_version(run: dict) -> str:
    """A tuned run's version is its configuration: a re-tuning is not reused."""
    return "tuned " + json.dumps({"lr": run["lr"], "options": run["options"]}, sort_keys=True)


def run_key(run: dict) -> tuple:
    """What makes a finished run reusable: its label, B, seed, epochs, subset and version."""
    return (run["label"], run["global_batch"], run["seed"], run["epochs"], run["train_subset"],
            run.get("version", 1))


def variant(quick: bool, batches: tuple[int, ...]) -> tuple[str, dict, list[dict], Path]:
    """(name, settings, planned runs, the runs' log) of one benchmark variant; the tuned
    runs planned are those of the tunings recorded so far (none in --quick)."""
    name = NAME + ("_quick" if quick else "")
    settings = QUICK if quick else {"train_subset": TRAIN_SUBSET, "epochs": EPOCHS,
                                    "seeds": SEEDS, "batches": batches}
    tuned = {} if quick else tuning.read_tuned()
    return (name, settings, plan_runs(**settings, tuned=tuned, quick=quick),
            RESULTS_DIR / f"{name}.runs.jsonl")
