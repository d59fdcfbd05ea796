"""The Ray-free half's one-process step rows of `python -m benchmarks gpu-acceptance`
(issue 26, item 7): per workload (the CNN and resnet18, on synthetic in-memory data) and
batch B, the step as the profiling loop times it (the same code: warm-up by time, the
data path's step in blocks, CUDA events) and one process's `fit` epochs, median of
epochs 2-3, against that profile's prediction (whole steps x mean step); and the data
path on the device (`tula_ray.training.batches`) against torch's DataLoader.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

from benchmarks.gpu.synthetic import EPOCHS, TEST_SAMPLES, synthetic_workload

WARMUP_SECONDS = 0.5
MEASURE_SECONDS = 1.0
# (name, samples, global batches, precisions); the quick variant is a smoke test.
# fp16 left out since issue 46 (H100, 2026-11-26: its rows' ratios 0.96-1.16, as fp32's
# and bf16's), so that the whole run fits its 10 minutes.
GRID = (("cnn", 60_000, (32, 128, 512, 2048), ("fp32", "bf16")),
        ("resnet18", 20_000, (32, 128, 512), ("fp32", "bf16")))
# --quick: fp16 on a CPU (its smoke test's device) takes ~1 s a step at B = 128, so its
# rows are 4 steps of B = 16 an epoch, 2 epochs (one left after the first's warm-up),
# scored on 64 images.
QUICK_GRID = (("cnn", 64, (16,), ("fp32", "fp16")),)
QUICK_EPOCHS, QUICK_TEST_SAMPLES = 2, 64
# (name, samples, local batches the memory model predicts, above the probe's 16, 32, 64)

def data_path(workload, batch: int, device: torch.device) -> dict[str, Any]:
    """Seconds to serve one epoch's batches on the device: the data path against a plain
    DataLoader over the same tensors (what the profile left out before issue 24)."""
    from tula_ray.training.batches import training_batches
    from tula_ray.training.measure import synchronize

    dataset = workload.train_dataset_fn()
    ours = training_batches(dataset, batch, device, seed=0)

    def serve(batches, move: bool) -> float:
        synchronize(device)
        started = time.perf_counter()
        for inputs, targets in batches:
            if move:
                inputs, targets = inputs.to(device, non_blocking=True), targets.to(device)
        synchronize(device)
        return time.perf_counter() - started

    serve(ours, False)  # the first pass places nothing new, but warms the kernels
    plain = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True,
                       pin_memory=device.type == "cuda")
    return {"path": ours.path, "batch": batch, "data_path_s": serve(ours, False),
            "dataloader_s": serve(plain, True), "samples": len(dataset)}


def training_step(workload, batch: int, device: torch.device):
    """The workers' step at `batch` in the workload's precision, in this one process (the
    data path's batches, `EpochTally.step`); returns (run_step, model, optimizer)."""
    from tula_ray.precision import set_math_mode
    from tula_ray.training.batches import training_batches
    from tula_ray.training.epochs import EpochTally
    from tula_ray.training.host_allocator import steady_host_allocator
    from tula_ray.training.step_timing import cycle
    from tula_ray.training.strategy_base import StrategySetup

    steady_host_allocator()  # as the profiling loop's Sweep holds it
    torch.manual_seed(0)
    set_math_mode(workload.precision)
    model = workload.model_fn().to(device).train()
    setup = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    setup.set_precision(workload.precision, device)
    tally = EpochTally(model, setup, workload.loss_fn(), device)
    batches = cycle(training_batches(workload.train_dataset_fn(), batch, device, seed=0))

    def run_step() -> None:
        tally.step(*next(batches))

    return run_step, model, setup.optimizer


def profiled_step_s(workload, batch: int, device: torch.device) -> dict[str, float]:
    """The mean step as the profiling loop times it, in this one process, in the
    workload's precision."""
    from tula_ray.training.step_timing import (max_measure_steps, mean_step_s,
                                               measured_step_count, spread, time_block, warm_up)

    run_step, _, _ = training_step(workload, batch, device)
    warm = warm_up(run_step, device, min_steps=3, min_seconds=WARMUP_SECONDS)
    steps = measured_step_count(warm[-1], 5, MEASURE_SECONDS, max_measure_steps(device))
    seconds = time_block(steps, run_step, device)
    return {"step_s": mean_step_s(seconds), "spread": spread(seconds), "steps": steps}


def fitted_epochs(workload, batch: int, device: torch.device, epochs: int) -> list[float]:
    from tula_ray.training.run import fit

    frame = fit(workload, global_batch=batch, strategy="lbt", epochs=epochs, device=device)
    return [float(s) for s in frame["seconds"]]


def step_rows(quick: bool, device: torch.device, time_left, keep) -> tuple[list, list]:
    """Per workload, B and precision: the profiled step against `fit`'s epochs (a row
    says when the run's time was spent before it)."""
    fit_epochs, test_samples = ((QUICK_EPOCHS, QUICK_TEST_SAMPLES) if quick
                                else (EPOCHS, TEST_SAMPLES))
    rows, paths = [], []
    for name, samples, batches, precisions in QUICK_GRID if quick else GRID:
        if name != "cnn" and importlib.util.find_spec("torchvision") is None:
            rows.append({"workload": name, "skipped": "torchvision is not installed"})
            continue
        paths.append({"workload": name, **data_path(synthetic_workload(name, samples),
                                                     batches[0], device)})
        for batch in batches:
            for precision in precisions:  # side by side: the ratio is measured in one run
                if time_left() <= 0:
                    rows.append({"workload": name, "global_batch": batch,
                                 "precision": precision, "skipped": "out of time"})
                    continue
                workload = synthetic_workload(name, samples, precision, test_samples)
                profile = profiled_step_s(workload, batch, device)
                epochs = fitted_epochs(workload, batch, device, fit_epochs)
                measured = statistics.median(epochs[1:])
                predicted = (samples // batch) * profile["step_s"]
                rows.append({"workload": name, "global_batch": batch, "precision": precision,
                             **profile, "predicted_epoch_s": predicted,
                             "fit_epoch_s": measured, "ratio": predicted / measured,
                             "fit_epochs_s": epochs})
                keep(rows[-1])
    return rows, paths
