"""Issue 25, item 1: how the gradient noise scale phi evolves while a model trains, and so
how the plan may use the value profiling measures on a barely trained model.

One process, no Ray: each workload trains with plain SGD at the reference batch M0 = 32
(its own LR), and at points along the run (log-spaced early, then every epoch's end)
`tula_ray.training.gradient_noise.measure_gradient_noise` takes pairs from the halves of
a fresh B = 256 batch of the training data: the profile's estimator on one worker, at the
weights of that moment (the measurement does not train). Reported per workload: phi at
each point, phi relative to phi at step 0 (what a profile sees) and at the early points,
and a calibration from early phi to the run's mean phi fitted on the first workload and
judged on the second (issue 25: "any calibration constant is fitted on one workload and
judged on the other").

A third trace follows the time-to-accuracy benchmark's own reference run (the CNN on its
10k-image subset at B = 32) every quarter epoch for 7 epochs: phi where that run reaches
each target, the phi that McCandlish et al.'s trade-off between steps and epochs takes
at a target (`time_to_accuracy` sets the plan made with it beside the profiled one).

Resumable: every point is appended to noise_evolution.runs.jsonl as it is measured; a
workload whose run was recorded to its end is not run again (a run cut off mid-way is
started over: its weights were not kept).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, markdown_table

NAME = "noise_evolution"
REFERENCE_BATCH = 32
PAIR_BATCH = 256  # each pair: two halves of 128 and their mean
EARLY_STEPS = (0, 25, 50, 100, 200, 400)
SUBSET_TRACE = "fashion-mnist-cnn-10k"  # time-to-accuracy's reference run, traced
# (label, workload, options, epochs, pairs per point, steps between points after the early
# ones: None, the epochs' ends only): the CNN on all of Fashion-MNIST, resnet18 on a 10k
# subset (a 28 x 28 resnet18 step costs ~9 ms per sample on these CPUs); the calibration
# is fitted on the first and judged on the second. Then the CNN as time-to-accuracy's
# reference trains it (its 10k subset; 7 epochs pass its last target, 5.5 epochs in).
WORKLOADS = (("fashion-mnist-cnn", "fashion-mnist-cnn", {}, 3, 24, None),
             ("resnet18-fashion-mnist", "resnet18-fashion-mnist", {"train_subset": 10_000}, 3,
              8, None),
             (SUBSET_TRACE, "fashion-mnist-cnn", {"train_subset": 10_000}, 7, 32, 78))
QUICK_WORKLOADS = (("fashion-mnist-cnn", "fashion-mnist-cnn", {"train_subset": 1024}, 1, 4,
                    None),)
CALIBRATED = 2  # the traces the calibration is fitted on and judged on: the first two


def _recorded(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trace(label: str, name: str, options: dict, epochs: int, pairs: int, every: int | None,
          log: Path) -> list[dict]:
    """Train `name` at B = 32 for `epochs`, measuring phi at the early steps, every `every`
    steps after them (None: none) and every epoch's end; each point is appended to `log`
    as it is measured, under `label`."""
    import torch

    from tula_ray.models.noise_scale import noise_scale
    from tula_ray.training.batches import training_batches
    from tula_ray.training.gradient_noise import measure_gradient_noise
    from tula_ray.training.step_timing import cycle
    from tula_ray.training.strategy_base import StrategySetup
    from tula_ray.workloads import resolve_workload

    workload = resolve_workload(name, options)
    torch.manual_seed(0)
    model = workload.model_fn().train()
    setup = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    loss_fn = workload.loss_fn()
    dataset = workload.train_dataset_fn()
    probes = cycle(training_batches(dataset, PAIR_BATCH, "cpu", seed=1))
    steps_per_epoch = len(dataset) // REFERENCE_BATCH
    last = steps_per_epoch * epochs
    points = sorted({s for s in EARLY_STEPS if s < last}
                    | set(range(max(EARLY_STEPS) + (every or 0), last, every or last))
                    | {steps_per_epoch * (e + 1) for e in range(epochs)})
    records, step, started = [], 0, time.perf_counter()

    def measure() -> None:
        average = measure_gradient_noise(model, setup, loss_fn, probes, pairs)
        grad_sqr, grad_var = average.estimate()
        record = {"workload": label, "step": step, "epoch": step / steps_per_epoch,
                  "grad_sqr": grad_sqr, "grad_var": grad_var,
                  "noise_scale": noise_scale(grad_sqr, grad_var), "pairs": average.steps,
                  "last": step == points[-1], "seconds": time.perf_counter() - started}
        records.append(record)
        with log.open("a") as stream:
            stream.write(json.dumps(record, default=float) + "\n")
        print(record, flush=True)

    for epoch in range(epochs):
        batches = training_batches(dataset, REFERENCE_BATCH, "cpu", seed=0)
        batches.set_epoch(epoch)
        for inputs, targets in batches:
            if step in points:
                measure()
            setup.train_step(model, loss_fn, inputs, targets)
            step += 1
    measure()  # the last epoch's end
    return records


def calibration(traces: dict[str, list[dict]], early_step: int) -> dict[str, Any]:
    """Mean phi over the run's epoch ends over phi at `early_step`, per workload; the first
    workload's ratio applied to the second's early phi, against its measured mean."""
    ratios = {}
    for name, points in traces.items():
        early = [p["noise_scale"] for p in points if p["step"] == early_step]
        later = [p["noise_scale"] for p in points if p["step"] > 0 and p["epoch"] % 1 == 0]
        if early and later and math.isfinite(early[0]) and early[0] > 0:
            ratios[name] = statistics.fmean(later) / early[0]
    names = list(ratios)
    judged = None
    if len(names) >= 2:
        fitted, other = names[0], names[1]
        judged = {"fitted_on": fitted, "judged_on": other, "constant": ratios[fitted],
                  "log_error": abs(math.log(ratios[fitted] / ratios[other]))}
    return {"early_step": early_step, "ratios": ratios, "judged": judged}


def run(quick: bool = False) -> dict:
    benchmark = Benchmark(NAME, quick)
    log = benchmark.log()
    recorded = _recorded(log)
    traces: dict[str, list[dict]] = {}
    for label, name, options, epochs, pairs, every in QUICK_WORKLOADS if quick else WORKLOADS:
        points = [r for r in recorded if r["workload"] == label]
        if not any(p["last"] for p in points):
            if points:  # cut off mid-run: its weights are gone, start it over
                recorded = [r for r in recorded if r["workload"] != label]
                log.write_text("".join(json.dumps(r) + "\n" for r in recorded))
            points = trace(label, name, options, epochs, pairs, every, log)
        traces[label] = points
    calibrated = dict(list(traces.items())[:CALIBRATED])
    return benchmark.record({"quick": quick, "traces": traces, "calibrations": [
        calibration(calibrated, s) for s in (0, 100, 400)]}, report, nested=True)


def report(result: dict) -> str:
    p = result["provenance"]
    body = []
    for name, points in result["traces"].items():
        first = points[0]["noise_scale"]
        for point in points:
            body.append([name, point["step"], f"{point['epoch']:.2f}", point["pairs"],
                         f"{point['grad_sqr']:.4g}", f"{point['grad_var']:.4g}",
                         f"{point['noise_scale']:.1f}",
                         f"{point['noise_scale'] / first:.2f}" if first > 0 else "-"])
    lines = ["### The gradient noise scale along a training run (issue 25, item 1)\n",
             f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
             f"Plain SGD at B = {REFERENCE_BATCH} from the workload's initial weights (seed 0); "
             f"at each step listed, pairs from the halves of fresh B = {PAIR_BATCH} batches "
             "(the profile's estimator on one worker) give |G|^2, tr(Sigma) and "
             "phi = tr(Sigma) / |G|^2.\n",
             markdown_table(["workload", "step", "epoch", "pairs", "|G|^2", "tr(Sigma)", "phi",
                             "phi / phi at step 0"], body), ""]
    for cal in result["calibrations"]:
        ratios = ", ".join(f"{n} {r:.2f}" for n, r in cal["ratios"].items())
        line = (f"- Mean phi at the epoch ends / phi at step {cal['early_step']}: "
                f"{ratios or '-'}.")
        if cal["judged"]:
            j = cal["judged"]
            line += (f" Fitted on {j['fitted_on']} ({j['constant']:.2f}) and applied to "
                     f"{j['judged_on']}: |log(predicted / measured)| = {j['log_error']:.2f}.")
        lines.append(line)
    return "\n".join(lines) + "\n"
