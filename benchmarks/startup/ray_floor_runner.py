"""Ray's own part of the demo, with nothing of tula-ray's work: run as a script with this tree
on PYTHONPATH, one fresh driver process, as the demo is.

    python benchmarks/startup/ray_floor_runner.py OUT SIZES REPORTS

It imports Ray and torch, starts tula-ray's local Ray (`start_local_ray`: loopback, the
dashboard on), runs one Tune experiment of one trial per cluster size in SIZES (e.g. 1,2),
each trial a TorchTrainer of that many gloo CPU workers whose function only reports
REPORTS times (no model, no data, no step), with the product's settings for a launch
(`prompt_train_polls`, `without_preemption_watcher`, `trial_resources`), and shuts Ray
down. Writes its parts (seconds) to OUT/floor.json.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

STARTED = time.perf_counter()


def report_only(config: dict) -> None:
    """A worker's function: the demo's reports (one per candidate), and nothing else."""
    import ray.train

    for candidate in range(config["reports"]):
        ray.train.report({"candidate": candidate})


def launch(config: dict) -> None:
    """A Tune trial: one worker group of `num_workers`, as a search's trial launches it."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    # Under the trial's own directory, as the product's trials keep their Train runs.
    TorchTrainer(report_only, train_loop_config={"reports": config["reports"]},
                 scaling_config=ScalingConfig(num_workers=config["num_workers"]),
                 run_config=RunConfig(storage_path=tune.get_context().get_trial_dir())).fit()
    tune.report({"launched": config["num_workers"]})


def main() -> int:
    out, sizes, reports = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    seconds: dict[str, float] = {}
    import ray
    from ray import tune

    importlib.import_module("torch")  # the demo's driver imports it too

    from tula_ray.cluster import (prompt_train_polls, start_local_ray, trial_resources,
                                  without_preemption_watcher)

    seconds["imports_s"] = time.perf_counter() - STARTED
    began = time.perf_counter()
    start_local_ray()
    seconds["ray_start_s"] = time.perf_counter() - began
    prompt_train_polls()
    without_preemption_watcher()
    began = time.perf_counter()
    tuner = tune.Tuner(
        tune.with_resources(launch, trial_resources()),
        param_space={"num_workers": tune.grid_search([int(s) for s in sizes.split(",")]),
                     "reports": reports},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(out / "ray_results"), name="floor",
                                  verbose=0))
    errors = tuner.fit().errors
    seconds["tune_s"] = time.perf_counter() - began
    began = time.perf_counter()
    ray.shutdown()
    seconds["ray_end_s"] = time.perf_counter() - began
    out.mkdir(parents=True, exist_ok=True)
    (out / "floor.json").write_text(json.dumps({**seconds, "errors": [str(e) for e in errors]}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
