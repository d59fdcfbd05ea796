"""python -m benchmarks profile-noise: the profile's noise scale at N = 2, its replicas apart
(as a search measured it until 2026-11-28) and joined (rank 0's weights broadcast first, as
it measures it since), against one process's pairs at the same weights.

The profile's compute-only steps run under DDP's `no_sync`, so each replica steps on its own
gradient, and the replicas drift apart; the noise's pairs then set each worker's gradient
against their mean, and the replicas' difference reads as noise. A search of the CNN at
N = 2 recorded |G|^2 < 0 in all three rows (adaptive_batch_fashion-mnist-cnn.plan.json,
4 standard errors below 0), where training measured phi = 12-146.

Protocol, fixed here before the first run: the CNN on Fashion-MNIST's first 10000 training
images (the time-to-accuracy benchmarks' data), two gloo workers (one thread each), the
workload's own optimizer, seed 0; per B in `BATCHES`, in order, on the same model: the
search's row (`profile_batch`) with the replicas left apart, then at those weights `PAIRS`
pairs with the replicas apart, the replicas joined (rank 0's weights), `PAIRS` pairs
joined, and on rank 0 alone `PAIRS` one-process pairs of the same b = B / 2 and B at the
same weights (the two halves of a batch: the estimator at N = 1, which no replica can
take apart), the reference. Each pair's (|G|^2, tr(Sigma)) is kept: phi is the ratio of
their means, its interval from `BOOTSTRAP` resamples of the pairs. Expected: joined within
the reference's interval; apart below it in |G|^2.

--quick: 512 images, B = 32, 8 pairs: a smoke test, not a measurement.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.common import Benchmark, markdown_table, spawn_gloo
from benchmarks.common.bootstrap import Bootstrap, percentile_interval

NAME = "profile_noise"
WORKLOAD = "fashion-mnist-cnn"
TRAIN_IMAGES = 10_000
BATCHES = (32, 256, 2048)  # the rows a default search of this grid profiles first
PAIRS = 64
WORLD_SIZE = 2
BOOTSTRAP = Bootstrap(resamples=2000, seed=0)
QUICK = {"train_images": 512, "batches": (32,), "pairs": 8}
FULL = {"train_images": TRAIN_IMAGES, "batches": BATCHES, "pairs": PAIRS}
ARMS = ("row", "apart", "joined", "reference")


def _pairs(training, batches, count: int, world_size: int) -> list[list[float]]:
    """`count` pairs of the profile's estimator, each its own (|G|^2, tr(Sigma))."""
    from tula_ray.models.noise_scale import NoiseAverage
    from tula_ray.training.gradient_noise import measure_gradient_noise

    measured = []
    for _ in range(count):
        average = measure_gradient_noise(
            training.model, training.plain, training.loss_fn, batches, 1,
            world_size=world_size, no_sync=training.no_sync, average=NoiseAverage())
        measured.append(list(average.estimate()))
    return measured


def _reference(sweep, batch: int, count: int) -> list[list[float]]:
    """Rank 0 alone: `count` pairs of the two halves of a B-sample batch of its weights."""
    import torch

    from tula_ray.distributed import unwrapped
    from tula_ray.training.profile_phases import ProfiledTraining

    module = unwrapped(sweep.training.model)
    one = ProfiledTraining(module, sweep.training.plain, sweep.training.loss_fn,
                           torch.device("cpu"), sweep.training.agreement, lambda m: m)
    return _pairs(one, sweep.batches(batch), count, world_size=1)


def _rank(rank: int, settings: dict, out: str) -> None:
    import torch.distributed as dist

    from tula_ray.distributed import replicas_from_rank0
    from tula_ray.training import profile_phases
    from tula_ray.training.profile_settings import ProfileSettings
    from tula_ray.training.profile_sweep import Sweep, SweepWorker, profile_batch

    with tempfile.TemporaryDirectory(prefix="tula-profile-noise-") as storage:
        profile = ProfileSettings(workload=WORKLOAD, training_strategy="lbt",
                                  workload_options={"train_subset": settings["train_images"]},
                                  storage_path=storage)
        sweep = Sweep(profile, SweepWorker.of_process_group(),
                      first_batch=min(settings["batches"]))
        results = []
        for batch in settings["batches"]:
            with mock.patch.object(profile_phases, "replicas_from_rank0", lambda *a: None):
                row = profile_batch(sweep, batch, round_index=1)  # the search's, apart
            batches = sweep.batches(batch // WORLD_SIZE)
            apart = _pairs(sweep.training, batches, settings["pairs"], WORLD_SIZE)
            replicas_from_rank0(sweep.training.model)
            joined = _pairs(sweep.training, batches, settings["pairs"], WORLD_SIZE)
            dist.barrier()
            reference = _reference(sweep, batch, settings["pairs"]) if rank == 0 else []
            dist.barrier()
            results.append({"batch": batch, "row": [[row["grad_sqr"], row["grad_var"]]],
                            "row_pairs": row["noise_steps"], "apart": apart,
                            "joined": joined, "reference": reference})
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def summarize(pairs: list[list[float]], bootstrap: Bootstrap) -> dict[str, Any]:
    """phi = mean tr(Sigma) / mean |G|^2 over the pairs, with its bootstrap interval (inf
    where the mean |G|^2 is not above 0), and the mean |G|^2 with its standard error."""
    import numpy as np

    values = np.asarray(pairs, float)
    if values.size == 0:
        return {"pairs": 0}

    def phi(rows: np.ndarray) -> float:
        grad_sqr, grad_var = rows.mean(axis=0)
        return float(grad_var / grad_sqr) if grad_sqr > 0 else math.inf

    generator = np.random.default_rng(bootstrap.seed)
    draws = [phi(values[generator.integers(0, len(values), len(values))])
             for _ in range(bootstrap.resamples)]
    se = float(values[:, 0].std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
    return {"pairs": len(values), "phi": phi(values),
            "phi_interval": list(percentile_interval(draws, bootstrap.percentiles)),
            "grad_sqr": float(values[:, 0].mean()), "grad_sqr_se": se,
            "grad_var": float(values[:, 1].mean())}


def _phi(summary: dict[str, Any]) -> str:
    if not summary.get("pairs"):
        return "-"
    low, high = summary["phi_interval"]
    return f"{summary['phi']:.4g} [{low:.4g}, {high:.4g}]"


def report(result: dict[str, Any]) -> str:
    provenance = result["provenance"]
    rows = []
    for measured in result["batches"]:
        for arm in ARMS:
            s = measured["summaries"][arm]
            if not s.get("pairs"):
                continue
            phi = f"{s['phi']:.4g}" if arm == "row" else _phi(s)
            se = "-" if arm == "row" else f"{s['grad_sqr_se']:.2g}"
            rows.append([measured["batch"], arm, s["pairs"], phi, f"{s['grad_sqr']:.4g}", se])
    return "\n".join([
        "### The profile's noise scale at N = 2: replicas apart, joined, and one process "
        "(issue 43, item 2; 2026-11-28)", "",
        f"`{provenance['command']}` at {provenance['commit']}, {provenance['date']}, "
        f"{provenance['machine']}.", "",
        f"{WORKLOAD} on Fashion-MNIST's first {result['settings']['train_images']} training "
        f"images, {WORLD_SIZE} gloo workers, seed 0. Per B, on one model in turn: `row` is "
        "the search's row with the replicas apart (its own pairs, as the search pooled "
        f"them before this change); `apart` {result['settings']['pairs']} more pairs at "
        "those weights; `joined` as many after rank 0's weights are broadcast (what the "
        "profile does now); `reference` as many one-process pairs (the halves of a B-sample "
        "batch: the same b and B) of rank 0's weights. phi = mean tr(Sigma) / mean |G|^2 "
        "over the pairs, with its 2.5-97.5 % interval from "
        f"{BOOTSTRAP.resamples} bootstrap resamples of them.", "",
        markdown_table(["B", "pairs of", "pairs", "phi [interval]", "mean signal G^2",
                        "its standard error"], rows), ""])


def run(quick: bool = False) -> dict:
    settings = QUICK if quick else FULL
    benchmark = Benchmark(NAME, quick)
    with tempfile.TemporaryDirectory(prefix="tula-profile-noise-") as scratch:
        out = Path(scratch, "pairs.json")
        spawn_gloo(_rank, WORLD_SIZE, settings, str(out), timeout_s=600)
        measured = json.loads(out.read_text())
    for entry in measured:
        entry["summaries"] = {arm: summarize(entry[arm], BOOTSTRAP) for arm in ARMS
                              if arm != "row"}
        grad_sqr, grad_var = entry["row"][0]
        entry["summaries"]["row"] = {"pairs": entry["row_pairs"], "grad_sqr": grad_sqr,
                                     "grad_var": grad_var,
                                     "phi": grad_var / grad_sqr if grad_sqr > 0 else math.inf}
    return benchmark.record({"quick": quick, "settings": dict(settings),
                             "batches": measured}, report, nested=True)

