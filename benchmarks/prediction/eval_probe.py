"""The profile's evaluation pass against a whole pass, side by side (issue 43, item 1): does
`tula_ray.training.epoch_costs.evaluation_s` predict what `train`'s `evaluate` takes?

For each case (workload, N, eval batch b), in one group of N gloo processes (one torch
thread each, as Ray Train places them here) on the workload's test set, `ROUNDS` rounds,
each of:
  - whole: `evaluate` over the rank's whole share, timed (after one untimed pass), the
    slowest rank's: what `train` waits for;
  - estimate: `evaluation_s` (passes of 1 and of 1 + k batches: the fixed cost once);
  - scaled (the estimate before 2026-11-29, as the baseline): one pass of
    `EVAL_PROBE_BATCHES` batches timed, scaled to the share's batch count.
The figures: each method's median over rounds over the whole's, per case. The protocol
is fixed here before the first recorded run. `--quick`: the CNN on 2 ranks alone, on a
2000-image slice of the test set, one round (one process start fewer in the suite).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, markdown_table, spawn_gloo

NAME = "eval_probe"
ROUNDS = 5
CASES = (("fashion-mnist-cnn", 1, 16), ("fashion-mnist-cnn", 2, 16),
         ("fashion-mnist-cnn", 2, 128), ("fashion-mnist-cnn", 1, 1024),
         ("resnet18-fashion-mnist", 2, 32), ("resnet18-fashion-mnist", 1, 128))
QUICK = {"cases": (("fashion-mnist-cnn", 2, 16),), "rounds": 1, "test_images": 2000}
FULL = {"cases": CASES, "rounds": ROUNDS, "test_images": None}


def _scaled_s(model, test_set, loss_fn, rank: int, world: int, eval_batch: int) -> float:
    """The baseline: a pass of EVAL_PROBE_BATCHES batches, scaled to the share's batches
    (the slowest rank's)."""
    from torch.utils.data import Subset

    from tula_ray.distributed import max_over_ranks
    from tula_ray.training.batches import evaluation_batches
    from tula_ray.training.epoch_costs import EVAL_PROBE_BATCHES
    from tula_ray.training.epochs import evaluate

    size = len(test_set)
    full = math.ceil(math.ceil((size - rank) / world) / eval_batch)
    probe = min(EVAL_PROBE_BATCHES, full)
    subset = Subset(test_set, range(min(size, probe * eval_batch * world)))
    batches = evaluation_batches(subset, eval_batch, "cpu", num_replicas=world, rank=rank)
    started = time.perf_counter()
    evaluate(model, batches, "cpu", loss_fn)
    (seconds,) = max_over_ranks([(time.perf_counter() - started) * full / probe])
    return seconds


def _whole_s(model, test_set, loss_fn, rank: int, world: int, eval_batch: int) -> float:
    from tula_ray.distributed import max_over_ranks
    from tula_ray.training.batches import evaluation_batches
    from tula_ray.training.epochs import evaluate

    batches = evaluation_batches(test_set, eval_batch, "cpu", num_replicas=world, rank=rank)
    started = time.perf_counter()
    evaluate(model, batches, "cpu", loss_fn)
    (seconds,) = max_over_ranks([time.perf_counter() - started])
    return seconds


def _case(rank: int, world: int, case: tuple, settings: dict[str, Any], out: str) -> None:
    import torch
    from torch.utils.data import Subset

    from tula_ray.training.batches import evaluation_batches
    from tula_ray.training.epoch_costs import evaluation_s
    from tula_ray.training.epochs import evaluate
    from tula_ray.workloads import resolve_workload

    name, _, eval_batch = case
    workload = resolve_workload(name)
    torch.manual_seed(0)
    model, loss_fn, test_set = workload.model_fn(), workload.loss_fn(), workload.test_dataset_fn()
    if settings["test_images"]:
        test_set = Subset(test_set, range(settings["test_images"]))
    evaluate(model, evaluation_batches(test_set, eval_batch, "cpu", num_replicas=world,
                                       rank=rank), "cpu", loss_fn)  # warm: allocator, threads
    rounds = []
    for index in range(settings["rounds"]):
        methods = {
            "whole": lambda: _whole_s(model, test_set, loss_fn, rank, world, eval_batch),
            "estimate": lambda: evaluation_s(model, test_set, loss_fn, torch.device("cpu"),
                                             eval_batch=eval_batch, num_replicas=world,
                                             rank=rank),
            "scaled": lambda: _scaled_s(model, test_set, loss_fn, rank, world, eval_batch)}
        order = list(methods) if index % 2 == 0 else list(reversed(methods))
        rounds.append({method: methods[method]() for method in order})
    if rank == 0:
        torch.save(rounds, out)


def run(quick: bool = False) -> dict:
    import torch

    settings = QUICK if quick else FULL
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for case in settings["cases"]:
            out = str(Path(scratch, "rounds.pt"))
            spawn_gloo(_case, case[1], case[1], case, settings, out)  # _case(rank, world, ...)
            rounds = torch.load(out)
            whole = statistics.median(r["whole"] for r in rounds)
            rows.append({"workload": case[0], "num_workers": case[1], "eval_batch": case[2],
                         "rounds": rounds, "whole_s": whole,
                         **{f"{m}_ratio": statistics.median(r[m] / r["whole"] for r in rounds)
                            for m in ("estimate", "scaled")}})
    return Benchmark(NAME, quick).record({"settings": {**settings, "cases": [
        list(c) for c in settings["cases"]]}, "rows": rows}, report)


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    body = [[r["workload"], r["num_workers"], r["eval_batch"], f"{r['whole_s']:.3f}",
             f"{r['estimate_ratio']:.2f}", f"{r['scaled_ratio']:.2f}"] for r in result["rows"]]
    errors = {m: [abs(r[f"{m}_ratio"] - 1) for r in result["rows"]]
              for m in ("estimate", "scaled")}
    images = f" (its first {s['test_images']} images)" if s["test_images"] else ""
    return "\n".join([
        "### The profile's evaluation pass against a whole pass, side by side (issue 43)\n",
        f"`{result['command']}` at {result['commit']}, {result['date']}, {result['machine']}.\n",
        f"gloo processes, one torch thread each, the workload's test set{images}; "
        f"{s['rounds']} rounds, each method's median over the rounds of its estimate over "
        "the same round's whole pass. estimate: `evaluation_s` (passes of 1 and 1 + k "
        "batches, the fixed cost once); scaled: one 2-batch pass scaled to the share (the "
        "estimate before 2026-11-29).\n",
        markdown_table(["workload", "N", "eval batch", "whole pass s", "estimate / whole",
                        "scaled / whole"], body), "",
        *(f"- {m}: median |ratio - 1| = {statistics.median(e):.1%}, worst {max(e):.1%}."
          for m, e in errors.items()), ""])
