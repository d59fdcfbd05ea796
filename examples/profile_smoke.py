"""Smoke run of the profiling layer: a 2 x 2 grid (N in {1, 2}, B in {32, 256}) on local Ray.

    RAY_AUTH_MODE=disabled .venv/bin/python examples/profile_smoke.py [--workload NAME] [--fake]

Uses tune.grid_search only to have something to run; tula_ray.search() drives
real searches with TulaSearcher. Prints one profile row per trial and the wall time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")  # a harmless error line otherwise

import pandas as pd  # noqa: E402
import ray  # noqa: E402
from ray import tune  # noqa: E402

from trainables.profiling_trial import trainable_with_resources  # noqa: E402
from tula_ray.cluster import start_local_ray  # noqa: E402
from tula_ray.profile_table import PROFILE_COLUMNS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="fashion-mnist-cnn")
    parser.add_argument("--fake", action="store_true", help="FakeData instead of Fashion-MNIST")
    parser.add_argument("--cluster-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--measure-steps", type=int, default=8)
    args = parser.parse_args()

    start_local_ray()  # loopback only; trials hold `train_driver`, not a CPU
    try:
        storage = tempfile.mkdtemp(prefix="tula-smoke-")
        tuner = tune.Tuner(
            trainable_with_resources(),
            param_space={
                "num_workers": tune.grid_search(args.cluster_sizes),
                "global_batch": tune.grid_search(args.batch_sizes),
                "workload": args.workload,
                "workload_options": {"data": "fake"} if args.fake else {},
                "warmup_steps": 3, "measure_steps": args.measure_steps,
            },
            # One trial at a time: concurrent trials would share the 2 CPUs and skew timings.
            tune_config=tune.TuneConfig(max_concurrent_trials=1),
            run_config=tune.RunConfig(storage_path=storage, name="profile-smoke", verbose=0),
        )
        started = time.perf_counter()
        results = tuner.fit()
        wall_s = time.perf_counter() - started
        frame = results.get_dataframe()
        frame = frame.rename(columns={"time_total_s": "trial_wall_s"})
        extra = ["trial_wall_s", "torch_threads", "step_time_spread", "memory_source"]
        columns = [c for c in (*PROFILE_COLUMNS, *extra) if c in frame.columns]
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            table = frame[columns].sort_values(["num_workers", "global_batch"])
            print(table.to_string(index=False))
        print(f"{len(frame)} trials in {wall_s:.1f} s; results under {storage}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
