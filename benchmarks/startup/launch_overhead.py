"""python -m benchmarks launch-overhead (issue 40): what one Ray Train launch costs beyond
its work, and how much of it is Ray Train's controller polling its workers.

Ray Train's controller learns that the workers' function ended, and takes their reports,
by polling them every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s by default). A launch then
waits on average half an interval after its last step, and since a worker holds one
report at a time (a queue of one), a report that comes less than an interval after the one
before waits for the next poll. Every search candidate group, every `train` and every
tuning trial is one launch: README's test command pays it about 35 times, the demo 3
times; a profile sweep reports once per candidate, a `train` once per epoch.

Protocol (fixed here before the first run): on tula-ray's own local Ray (2 CPUs), a
TorchTrainer of `WORLD_SIZE` gloo CPU workers whose function reports `REPORTS` times, each
after `ITERATIONS` 256 x 256 matmuls on one thread (about a second here, timed inside). The
arms differ only in the poll interval the driver passes on to the controller (Ray
propagates the variable): Ray's default and tula-ray's (`tula_ray.cluster.TRAIN_POLL_S`).
`ROUNDS` rounds of one launch per arm, the order alternating. Per launch:
  start: `fit()` called to rank 0's function starting (the controller, the placement
         group, the workers, torch's process group);
  work:  the function's timed work (does polling more often slow it?);
  waiting in reports: rank 0's time inside its reports but the last;
  end:   rank 0's last report to `fit()` returning (the last poll, the shutdown).
Reported: each arm's medians with [min, max], and the median of the paired differences.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import Benchmark, markdown_table

NAME = "launch_overhead"
WORLD_SIZE = 2
ROUNDS, QUICK_ROUNDS = 8, 1
REPORTS, QUICK_REPORTS = 4, 2
# ~1 s of one core's matmuls per report here (0.5 ms each): a profile candidate's order
ITERATIONS, QUICK_ITERATIONS = 2000, 50
RAY_DEFAULT = "ray default"
TULA = "tula-ray"


def _work(config: dict) -> None:
    """The launch's function: `reports` chunks of timed work, each reported as a profile
    sweep reports a candidate (Ray Train's worker holds one report until the controller's
    poll takes it, so a report that comes sooner waits)."""
    import torch
    import ray.train

    started = time.time()
    torch.set_num_threads(1)  # one CPU per worker
    matrix = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    work_s = report_s = 0.0
    for index in range(config["reports"]):
        chunk_started = time.perf_counter()
        for _ in range(config["iterations"]):
            matrix = torch.tanh(matrix @ matrix)
        reported = time.perf_counter()
        work_s += reported - chunk_started
        if index == config["reports"] - 1 and ray.train.get_context().get_world_rank() == 0:
            # (a run keeps only its checkpoints' metrics: the times go by file, one machine)
            Path(config["out"]).write_text(json.dumps(
                {"started": started, "work_s": work_s, "report_s": report_s,
                 "ended": time.time()}))
        ray.train.report({"index": index})
        report_s += time.perf_counter() - reported
    # the last report's own wait (until the final poll) is in `end`


def _launch(interval: str, reports: int, iterations: int, storage: str) -> dict[str, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tula_ray.cluster import TRAIN_POLL_ENV

    os.environ[TRAIN_POLL_ENV] = interval  # what the driver passes on to the controller
    out = Path(storage, "times.json")
    trainer = TorchTrainer(_work, train_loop_config={"reports": reports, "out": str(out),
                                                     "iterations": iterations},
                           scaling_config=ScalingConfig(num_workers=WORLD_SIZE),
                           run_config=RunConfig(storage_path=storage))
    called = time.time()
    trainer.fit()
    returned = time.time()
    metrics = json.loads(out.read_text())
    return {"start_s": metrics["started"] - called, "work_s": metrics["work_s"],
            "report_wait_s": metrics["report_s"], "end_s": returned - metrics["ended"],
            "wall_s": returned - called}


def run(quick: bool = False) -> dict:
    import tempfile

    import ray
    from ray.train.v2._internal.constants import DEFAULT_HEALTH_CHECK_INTERVAL_S

    from tula_ray.cluster import TRAIN_POLL_ENV, TRAIN_POLL_S, start_local_ray

    rounds = QUICK_ROUNDS if quick else ROUNDS
    reports, iterations = (QUICK_REPORTS, QUICK_ITERATIONS) if quick else (REPORTS, ITERATIONS)
    intervals = {RAY_DEFAULT: str(DEFAULT_HEALTH_CHECK_INTERVAL_S), TULA: str(TRAIN_POLL_S)}
    saved = os.environ.get(TRAIN_POLL_ENV)
    launches: dict[str, list[dict[str, float]]] = {arm: [] for arm in intervals}
    joined = ray.is_initialized()  # a test's shared Ray; the benchmark starts its own
    if not joined:
        start_local_ray(num_cpus=WORLD_SIZE, verbose=0)
    try:
        with tempfile.TemporaryDirectory(prefix="tula-launch-overhead-") as storage:
            for round_index in range(rounds):
                order = list(intervals) if round_index % 2 == 0 else list(intervals)[::-1]
                for arm in order:
                    launches[arm].append(_launch(intervals[arm], reports, iterations, storage))
    finally:
        if not joined:
            ray.shutdown()
        os.environ.pop(TRAIN_POLL_ENV, None)
        if saved is not None:
            os.environ[TRAIN_POLL_ENV] = saved
    return Benchmark(NAME, quick).record(
        {"rounds": rounds, "reports": reports, "iterations": iterations, "world_size": WORLD_SIZE,
         "intervals_s": intervals, "launches": launches}, report)


def seconds_spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def report(r: dict) -> str:
    launches, parts = r["launches"], ("start_s", "work_s", "report_wait_s", "end_s",
                                         "wall_s")
    rows = [[f"{arm} ({r['intervals_s'][arm]} s)",
             *[seconds_spread([launch[part] for launch in launches[arm]]) for part in parts]]
            for arm in launches]
    paired = {part: statistics.median(t[part] - d[part] for t, d in
                                      zip(launches[TULA], launches[RAY_DEFAULT]))
              for part in parts}
    return f"""### What one Ray Train launch costs beyond its work, and its controller's polls (issue 40)

`{r['command']}` at {r['commit']}, {r['date']}, {r['machine']}.

A TorchTrainer of {r['world_size']} gloo CPU workers on tula-ray's local Ray, its function
{r['reports']} reports, each after {r['iterations']} 256 x 256 matmuls (as a profile sweep
reports each candidate); the arms differ only in the controller's poll interval
(RAY_TRAIN_HEALTH_CHECK_INTERVAL_S). {r['rounds']} rounds of one launch per arm, the order
alternating. Seconds, median [min, max] over the launches.

{markdown_table(["poll interval", "start", "work", "waiting in reports", "end", "wall"],
                rows)}

- tula-ray's interval less Ray's default, median of the paired differences: start
  {paired['start_s']:+.2f} s, work {paired['work_s']:+.2f} s, waiting in reports
  {paired['report_wait_s']:+.2f} s, end {paired['end_s']:+.2f} s, wall {paired['wall_s']:+.2f} s.
"""
