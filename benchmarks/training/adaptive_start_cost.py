"""python -m benchmarks adaptive-start-cost (issue 44): what an adaptive run's AGS-NS costs a
step at a batch no larger than its reference batch, where a fixed run of that batch trains
plain steps.

adaptive-batch-v2's report (added after its runs) found the CNN's adaptive runs 1.21-1.41x
slower than the fixed B = 32 runs over the same steps, before their first switch. An
adaptive run builds its strategy at its largest allowed batch (`run._adaptive_build_batch`),
so AGS-NS's optimizer and its local-gradient comm hook run at B = 32 as well. This measures
that alone, with the strategy's own builds, on two gloo workers (b = 16), the CNN, B = 32:
  "plain": what `ags-ns` builds at B = 32 (nothing to scale: the workload's optimizer);
  "ags-ns built at 2048": what an adaptive run trains at B = 32: `ags-ns` built at B = 2048,
      then `set_global_batch(2048, 32)`, as the run's batch adapter does.
Each round times a block of `STEPS` steps of each, back to back in the same processes, the
order alternating; the cost is the median over `ROUNDS` rounds of (ags-ns block / plain
block) - 1, with its spread, and per step in milliseconds. Fixed here before the first run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.common import Benchmark, markdown_table, spawn_gloo, spread
from tula_ray.training.ags_strategy import NoiseScaleAGS
from tula_ray.training.measure import synthetic_batch
from tula_ray.workloads import FashionCNN, sgd

NAME = "adaptive_start_cost"
GLOBAL_BATCH, BUILT_AT, WORLD_SIZE = 32, 2048, 2
ROUNDS, STEPS = 15, 200
QUICK_ROUNDS, QUICK_STEPS = 2, 10
ARMS = ("plain", f"ags-ns built at {BUILT_AT}")


def _setup(arm: str, model: nn.Module):
    """The arm's strategy setup, built as `train` builds it (module docstring)."""
    built_at = GLOBAL_BATCH if arm == "plain" else BUILT_AT
    setup = NoiseScaleAGS().build(model, global_batch=built_at, steps_per_epoch=1, epochs=1,
                                  lr=None, momentum=None, weight_decay=None, options={},
                                  optimizer_fn=sgd)
    setup.set_global_batch(built_at, GLOBAL_BATCH)
    return setup


def _block_seconds(model: nn.Module, setup, batches) -> float:
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    started = time.perf_counter()
    for inputs, targets in batches:
        setup.train_step(model, loss_fn, inputs, targets)
    dist.barrier()
    return time.perf_counter() - started


def _worker(rank: int, rounds: int, steps: int, out: str) -> None:
    local = GLOBAL_BATCH // WORLD_SIZE
    batches = [synthetic_batch((1, 28, 28), 10, local, seed=rank * steps + s)
               for s in range(steps)]
    arms = {}
    for arm in ARMS:  # one model and setup per arm, kept across rounds (warm state)
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(FashionCNN())
        arms[arm] = (model, _setup(arm, model))
        _block_seconds(*arms[arm], batches[:5])  # warm-up: allocator, thread pool, hook
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_index in range(rounds):
        order = ARMS if round_index % 2 == 0 else ARMS[::-1]
        for arm in order:
            seconds[arm].append(_block_seconds(*arms[arm], batches))
    if rank == 0:
        torch.save({"seconds": seconds, "optimizers": {
            arm: type(setup.optimizer).__name__ for arm, (_, setup) in arms.items()}}, out)


def run(quick: bool = False) -> dict:
    rounds, steps = (QUICK_ROUNDS, QUICK_STEPS) if quick else (ROUNDS, STEPS)
    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch, "result.pt"))
        spawn_gloo(_worker, WORLD_SIZE, rounds, steps, out)
        measured = torch.load(out)
    plain, ags = (measured["seconds"][arm] for arm in ARMS)
    return Benchmark(NAME, quick).record(
        {"rounds": rounds, "steps": steps, "global_batch": GLOBAL_BATCH, "built_at": BUILT_AT,
         "world_size": WORLD_SIZE, "seconds": measured["seconds"],
         "optimizers": measured["optimizers"],
         "cost": [a / p - 1 for a, p in zip(ags, plain)],
         "extra_ms": [1000 * (a - p) / steps for a, p in zip(ags, plain)]}, report)


def report(r: dict) -> str:
    rows = [[arm, r["optimizers"][arm],
             f"{1000 * statistics.median(r['seconds'][arm]) / r['steps']:.2f}"]
            for arm in ARMS]
    extra = statistics.median(r["extra_ms"])
    return f"""### What an adaptive run's AGS-NS costs at its reference batch (issue 44)

`{r['command']}` at {r['commit']}, {r['date']}, {r['machine']}.

The CNN at N = {r['world_size']} (gloo), B = {r['global_batch']}: the strategy `ags-ns` built
at B = {r['global_batch']} (plain steps) against `ags-ns` built at B = {r['built_at']} and set
to B = {r['global_batch']} (what `train(plan, batch="adaptive")` trains there). {r['rounds']}
rounds of a {r['steps']}-step block of each, back to back, the order alternating.

{markdown_table(["arm", "optimizer", "ms per step (median)"], rows)}

- Cost: {spread(r['cost'])} (median [min, max] over rounds), {extra:.2f} ms a step.
"""
