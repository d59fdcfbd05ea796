"""The profiled step against `train`'s, in one process, with glibc's malloc held steady or
left adaptive (issue 43: the profile's smallest batches read slower than `train` ran).

Each run is a fresh process, as a worker of a launch is: it profiles one batch B as the
profiling loop profiles a launch's first batch (`Sweep`, `profile_batch`: warm-up, the
timed steps, the untimed phases), then trains the same B with `fit` for EPOCHS epochs (the
plain step, `lbt`). The process's allocator is the arm: "steady" (`tula_ray.training.
host_allocator`: both thresholds fixed) or "default" (TULA_RAY_HOST_ALLOCATOR=default:
glibc's adaptive ones). Per run: the profiled step, and each epoch's seconds over its
steps. The figure is the profile over the last epoch's step (what `python -m benchmarks
train-time` compares: epochs after the first), per run, then its median over the runs.

The protocol is fixed here, before the first run: the demo's workload on TRAIN_SUBSET
images, BATCHES, PROCESSES runs per arm and B, the arms' order alternating from one run
to the next and the batches' order rotating, one torch thread (a one-CPU worker). Every
run is appended to host_allocator.runs.jsonl as it ends; a session that stops mid-run
resumes from the runs recorded at the same commit. `--quick`: one run per arm at B = 32
on the CNN's synthetic data (512 images), a smoke test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, markdown_table, rotated_schedule
from benchmarks.common.provenance import provenance
from benchmarks.common.resumable import read_runs

NAME = "host_allocator"
REPO = Path(__file__).parents[2]
WORKLOAD = "fashion-mnist-cnn"
TRAIN_SUBSET = 20_000
BATCHES = (32, 128, 512)
PROCESSES = 4  # per arm and B
EPOCHS = 2
ARMS = ("steady", "default")
# --quick: the same model on synthetic data (no Fashion-MNIST to read, a small test set).
QUICK = {"workload": "fashion-mnist-cnn-fake", "options": {"fake_size": 512},
         "batches": (32,), "processes": 1}


def child(arm: str, batch: int, workload: str, options: dict[str, Any]) -> None:
    """One run, in this fresh process: print its row as the last line (JSON)."""
    import torch

    from tula_ray.training.host_allocator import ENV, steady_host_allocator
    from tula_ray.training.profile_settings import ProfileSettings
    from tula_ray.training.profile_sweep import Sweep, SweepWorker, profile_batch
    from tula_ray.training.run import fit
    from tula_ray.workloads import get_workload

    assert os.environ.get(ENV) == arm, "the parent sets the arm"
    torch.set_num_threads(1)
    sweep = Sweep(ProfileSettings(workload=workload, workload_options=options),
                  SweepWorker.of_process_group(), first_batch=batch)
    row = profile_batch(sweep, batch)
    del sweep
    trained = get_workload(workload, **options)
    frame = fit(trained, global_batch=batch, strategy="lbt", epochs=EPOCHS)
    steps = trained.train_size // batch
    print(json.dumps({"allocator": steady_host_allocator(),
                      "profile_step_s": row["step_time_s"],
                      "profile_steps": row["measure_steps"],
                      "epoch_step_s": [float(s) / steps for s in frame["seconds"]]}))


def schedule(batches, processes: int) -> list[tuple[int, int, str]]:
    """(run, B, arm) in order: per run every B (`rotated_schedule`: the order rotating),
    both arms at each (which goes first alternating)."""
    order = []
    for index, (run, batch) in enumerate(rotated_schedule(range(processes), batches)):
        turn = index % len(batches)  # the batch's place in its run
        arms = ARMS if (run + turn) % 2 == 0 else ARMS[::-1]
        order += [(run, batch, arm) for arm in arms]
    return order


def _run_child(arm: str, batch: int, workload: str,
               options: dict[str, Any]) -> dict[str, Any]:
    from tula_ray.training.host_allocator import ENV

    code = (f"from benchmarks.training.host_allocator import child; "
            f"child({arm!r}, {batch}, {workload!r}, {options!r})")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, ENV: arm, "PYTHONPATH": str(REPO)})
    if done.returncode:
        raise RuntimeError(f"the {arm} run at B={batch} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict:
    bench = Benchmark(NAME, quick)
    workload, options, batches, processes = (
        (QUICK["workload"], QUICK["options"], QUICK["batches"], QUICK["processes"]) if quick
        else (WORKLOAD, {"train_subset": TRAIN_SUBSET}, BATCHES, PROCESSES))
    commit, log = provenance()["commit"], bench.log()
    done = {(r["run"], r["batch"], r["arm"]) for r in read_runs(log) if r["commit"] == commit}
    for key in schedule(batches, processes):
        if key in done:
            continue
        row = {"run": key[0], "batch": key[1], "arm": key[2], "commit": commit,
               **_run_child(key[2], key[1], workload, options)}
        print({k: v for k, v in row.items() if k != "commit"}, flush=True)
        with log.open("a") as out:
            out.write(json.dumps(row) + "\n")
    runs = [r for r in read_runs(log) if r["commit"] == commit]
    return bench.record({"workload": workload, "workload_options": options,
                         "train_subset": options.get("train_subset"), "epochs": EPOCHS,
                         "batches": list(batches), "processes": processes, "runs": runs},
                        report)


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.2f} [{1000 * min(values):.2f}, " \
           f"{1000 * max(values):.2f}]"


def _data(result: dict) -> str:
    if result.get("train_subset"):
        return f"{result['train_subset']} images"
    return f"options {result.get('workload_options')}"


def ratios(runs: list[dict]) -> list[float]:
    """Each run's profiled step over its last epoch's step."""
    return [r["profile_step_s"] / r["epoch_step_s"][-1] for r in runs]


def report(result: dict) -> str:
    p, runs = result, result["runs"]
    rows = []
    for batch in result["batches"]:
        for arm in ARMS:
            mine = [r for r in runs if r["batch"] == batch and r["arm"] == arm]
            if not mine:
                continue
            rows.append([batch, arm, _ms([r["profile_step_s"] for r in mine]),
                         _ms([r["epoch_step_s"][0] for r in mine]),
                         _ms([r["epoch_step_s"][-1] for r in mine]),
                         " ".join(f"{x:.2f}" for x in ratios(mine)), len(mine)])
    lines = [
        "### The profiled step against `train`'s, glibc's malloc steady or adaptive "
        "(issue 43)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        f"Each run is a fresh process: the profiling loop's first batch of a launch, then "
        f"`fit` at the same B for {result['epochs']} epochs ({result['workload']}, "
        f"{_data(result)}, one torch thread, the plain step). Step times in "
        "ms, median [min, max] over the runs; `profile / train` is each run's profiled "
        "step over its last epoch's step.\n",
        markdown_table(["B", "malloc", "profiled step", "train, epoch 1", "train, last epoch",
                        "profile / train, per run", "runs"], rows), ""]
    for arm in ARMS:
        mine = ratios([r for r in runs if r["arm"] == arm])
        if mine:
            errors = [abs(x - 1) for x in mine]
            lines.append(f"- {arm}: median |profile / train - 1| = "
                         f"{100 * statistics.median(errors):.1f}%, worst "
                         f"{100 * max(errors):.1f}% over {len(mine)} runs.")
    return "\n".join(lines) + "\n"
