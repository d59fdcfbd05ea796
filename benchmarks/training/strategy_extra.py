"""How steady is the profile's measure of what a training strategy adds to a step?

The profiling loop's strategy phase (`trainables.strategy_cost`) times plain and strategy
steps in alternating blocks, about a second in all, and the plan adds the difference to
every predicted step. Three searches of the time-to-accuracy benchmark measured 2.6, 3.0
and 0.5 ms for the same AGS-NS step (one of them then chose the wrong B). Here, without
Ray, two gloo workers (DDP, as Ray Train places them here) repeat that phase `REPEATS`
times on the Fashion-MNIST CNN with AGS-NS at B = 64 (local 32: the batch the sweep picks
for AGS-NS on N = 2), each repeat timing every layout of blocks in `LAYOUTS` in turn (the
loop's 3 blocks, finer ones, single steps; the order rotating), and each layout's steps
give two estimators side by side:
  mean:   the slowest worker's mean strategy step less its mean plain step (the loop's
          estimator);
  median: the same with medians.
The reference is the mean difference pooled over every repeat and layout (what an epoch's
sum adds, its hiccups averaged). Reported per layout and estimator: the median, range and
error against the reference over the repeats.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from benchmarks.common import Benchmark, markdown_table, spawn_gloo

NAME = "strategy_extra"
STRATEGY = "ags-ns"
GLOBAL_BATCH = 64
WORLD_SIZE = 2
REPEATS = 20
BLOCKS = 3  # the loop's ALTERNATING_BLOCKS (checked at run time)
STEPS = 33  # per kind: ~0.5 s of 15 ms steps, the loop's budget at this B
# Alternating blocks per kind, the same steps in all: the loop's 3, finer, one step each.
LAYOUTS = (BLOCKS, 11, 33)
# --quick, a smoke test: 3 repeats of the loop's 3 blocks and of single steps, over 6 steps
# per kind instead of 33 (a step here takes 15 to 50 ms, with the machine's load).
QUICK = {"repeats": 3, "steps": 6, "layouts": (BLOCKS, 6)}
DATASET_SIZE = 4096
ESTIMATORS = ("mean", "median")


def _rank(rank: int, settings: dict[str, Any], out: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import TensorDataset

    from tula_ray.training.batches import training_batches
    from tula_ray.training.epochs import EpochTally
    from tula_ray.training.step_timing import ALTERNATING_BLOCKS, cycle, time_block
    from tula_ray.training.strategies import build_strategy, get_training_strategy
    from tula_ray.training.strategy_base import StrategySetup
    from tula_ray.workloads import get_workload

    assert ALTERNATING_BLOCKS == BLOCKS, "the benchmark times the loop's blocks"
    torch.manual_seed(0)
    device = torch.device("cpu")
    workload = get_workload("fashion-mnist-cnn")
    data = TensorDataset(torch.randn(DATASET_SIZE, 1, 28, 28),
                         torch.randint(0, 10, (DATASET_SIZE,)))
    batches = cycle(training_batches(data, GLOBAL_BATCH // WORLD_SIZE, device, seed=0,
                                     num_replicas=WORLD_SIZE, rank=rank))
    loss_fn = workload.loss_fn()
    plain_model = DistributedDataParallel(workload.model_fn())
    plain = StrategySetup("plain", workload.optimizer_fn(plain_model.parameters()))
    plain.set_precision(workload.precision, device)
    plain_tally = EpochTally(plain_model, plain, loss_fn, device)
    model = DistributedDataParallel(workload.model_fn())
    strategy = get_training_strategy(STRATEGY)
    options, _ = strategy.check(WORLD_SIZE, GLOBAL_BATCH, {})
    setup = build_strategy(strategy, model, global_batch=GLOBAL_BATCH,
                           steps_per_epoch=DATASET_SIZE // GLOBAL_BATCH, epochs=1,
                           options=options, optimizer_fn=workload.optimizer_fn)
    setup.set_precision(workload.precision, device)
    setup.start_epoch(0)
    tally = EpochTally(model, setup, loss_fn, device)
    for _ in range(10):  # warm both, untimed (the loop warms the plain model; the first
        plain_tally.step(*next(batches))  # strategy step builds its state)
        tally.step(*next(batches))
    layouts, steps = settings["layouts"], settings["steps"]
    records = []  # [repeat][layout] -> {"plain": [...], "strategy": [...]}
    for repeat in range(settings["repeats"]):
        by_layout = {}
        # The layouts' order rotates from repeat to repeat: drift falls on each alike.
        for blocks in layouts[repeat % len(layouts):] + layouts[:repeat % len(layouts)]:
            plain_s: list[float] = []
            strategy_s: list[float] = []
            for _ in range(blocks):
                plain_s += time_block(steps // blocks,
                                      lambda: plain_tally.step(*next(batches)), device)
                strategy_s += time_block(steps // blocks,
                                         lambda: tally.step(*next(batches)), device)
            by_layout[blocks] = {"plain": plain_s, "strategy": strategy_s}
        records.append(by_layout)
    gathered: list[Any] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, records)
    if rank == 0:
        out.put(gathered)


def _estimate(per_rank: list[dict[str, list[float]]], estimator: str) -> float:
    """The loop's way: each kind's statistic, the slowest worker's, then the difference."""
    statistic = statistics.fmean if estimator == "mean" else statistics.median
    slowest = {kind: max(statistic(rank[kind]) for rank in per_rank)
               for kind in ("plain", "strategy")}
    return slowest["strategy"] - slowest["plain"]


def run(quick: bool = False) -> dict[str, Any]:
    import torch.multiprocessing as mp

    settings = QUICK if quick else {"repeats": REPEATS, "steps": STEPS, "layouts": LAYOUTS}
    repeats = settings["repeats"]
    queue = mp.get_context("spawn").Manager().Queue()
    spawn_gloo(_rank, WORLD_SIZE, settings, queue)
    gathered = queue.get()  # [rank][repeat][layout] -> {"plain": [...], "strategy": [...]}
    kinds = ("plain", "strategy")
    pooled = [{kind: [s for rec in gathered[rank] for layout in rec.values()
                      for s in layout[kind]] for kind in kinds} for rank in range(WORLD_SIZE)]
    reference = _estimate(pooled, "mean")
    variants = []
    for blocks in settings["layouts"]:
        for estimator in ESTIMATORS:
            values = np.array([_estimate([gathered[rank][i][blocks]
                                          for rank in range(WORLD_SIZE)], estimator)
                               for i in range(repeats)])
            errors = np.abs(values - reference)
            variants.append({
                "blocks": blocks, "estimator": estimator, "values_s": values.tolist(),
                "median_s": float(np.median(values)), "min_s": float(values.min()),
                "max_s": float(values.max()), "median_abs_error_s": float(np.median(errors)),
                "worst_abs_error_s": float(errors.max())})
    plain_step = statistics.median(s for rank in pooled for s in rank["plain"])
    return Benchmark(NAME, quick).record(
        {"quick": quick, "repeats": repeats, "strategy": STRATEGY, "global_batch": GLOBAL_BATCH,
         "world_size": WORLD_SIZE, "steps_per_kind": settings["steps"],
         "reference_s": reference, "reference_median_s": _estimate(pooled, "median"),
         "plain_step_s": plain_step, "variants": variants}, report, nested=True)


def report(result: dict[str, Any]) -> str:
    p = result["provenance"]
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    rows = [[v["blocks"], result["steps_per_kind"] // v["blocks"], v["estimator"],
             ms(v["median_s"]), f"{ms(v['min_s'])} - {ms(v['max_s'])}",
             ms(v["median_abs_error_s"]), ms(v["worst_abs_error_s"])]
            for v in result["variants"]]
    return "\n".join([
        "### What the training strategy adds to a step: the profile's estimator (issue 24)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        f"{result['strategy']} at B = {result['global_batch']} on {result['world_size']} gloo "
        f"workers (DDP, no Ray), the Fashion-MNIST CNN: the profile's strategy phase "
        f"({result['steps_per_kind']} plain and as many strategy steps, in alternating "
        f"blocks) repeated {result['repeats']} times in the same processes, each layout of "
        f"blocks in turn (the order rotating), each repeat's steps estimated two ways "
        f"(the slowest worker's mean or median strategy step less its plain one). "
        f"Reference: the mean difference pooled over every repeat and layout, "
        f"{ms(result['reference_s'])} ms (pooled medians "
        f"{ms(result['reference_median_s'])} ms; plain step {ms(result['plain_step_s'])} "
        f"ms). The profile ran {BLOCKS} blocks and the mean.\n",
        markdown_table(["blocks", "steps per block", "estimator", "median ms", "range ms",
                        "median |error| ms", "worst |error| ms"], rows), ""])
