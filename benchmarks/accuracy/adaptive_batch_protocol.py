"""The adaptive-batch benchmark's protocol (issue 44, item 4), fixed here before any run is
recorded (tests/test_benchmark_protocols.py checks the order from git history): a change
after results/adaptive_batch.* exist is a new protocol, with new results files.

Question: does `tula_ray.train(plan, batch="adaptive")` reach a validation accuracy as soon
as the best fixed batch would, and sooner than the plan's static time-to-accuracy choice?

Data (no other benchmark tuned on it): Fashion-MNIST's training images, less those any
other benchmark trains or scores on (the first 30,000: time-to-accuracy's subset and its
held-out split, prediction, noise-evolution, online-noise, equal-progress, train-time;
and the 10,000 drawn with subset_seed 0: generalization and its tuning), 24,952 images,
permuted by torch.randperm with seed `DATA_SEED`. A workload trains on the pool's first
`train_images` and is judged on `val_images` from position `VAL_START` on: disjoint.
Fashion-MNIST's test set is read only to report each run's final accuracy. `SPLIT_SHA256`
pins the indices; the runner refuses to train on others (a library that permutes
differently).

Arms, at N = `WORLD_SIZE`, each run training to the late target (the early one read from
the same run's evaluations), the workload's strategy `STRATEGY` for all:
  fixed B: every batch of the plan's N, on the selection seeds; the best per target (the
    least median time there) is then scored on the scoring seeds, so its score carries no
    winner's curse;
  static: the plan's `time_to_accuracy` choice per target, E0 the median epochs of the
    B = M0 runs on the selection seeds (validation data only), scored on the scoring seeds;
  M0: B = the plan's reference batch, scored on the scoring seeds;
  adaptive: `train(plan, batch="adaptive")`, scored on the scoring seeds.
Time to a target: `train`'s `time_to_target_s` less the evaluations up to it (the
instrument, not the method: each evaluation's seconds are the run's mean), the first
evaluation that reaches it (no interpolation); a run that never does counts as +inf.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Mapping

from benchmarks.common.bootstrap import Bootstrap

PROTOCOL_VERSION = 1
DATA_SEED = 44  # the number: the permutation of the pool
TRAIN_SIZE = 60_000  # Fashion-MNIST's training set
TAKEN_PREFIX = 30_000  # the first images, which other benchmarks train and score on
TAKEN_SUBSET_SEED, TAKEN_SUBSET = 0, 10_000  # generalization's (and its tuning's) subset
VAL_START = 10_000  # the validation images start here in the pool, after every train set
# split_digest() when the protocol was fixed: the pool's order every split is a slice of.
SPLIT_SHA256 = "7d931b8594718b434fb48eff1acb271534a82c52f277a6daef574e41c9e0fbec"
WORLD_SIZE = 2
STRATEGY = "ags-ns"  # the plan's default training strategy: what `train(plan)` runs
TIME_MEASURE = "train_seconds"  # time_to_target_s less the evaluations before it
# What "a recorded run" is: any results file of this benchmark, committed (its runs' log,
# its result and report, its plans; the --quick ones are git-ignored, never committed).
RESULTS_GLOBS = ("benchmarks/results/adaptive_batch.*", "benchmarks/results/adaptive_batch_*")


@dataclass(frozen=True)
class WorkloadProtocol:
    """One workload's data, targets and budgets.

    targets: (early, late) validation accuracies; target_sources: which recorded figure
    informed each. eval_every_samples: training samples between two evaluations (the same
    for every arm). max_epochs: the most a run trains (a run that stops there unreached is
    +inf). min_batch, max_batch: the search's batch range at N = WORLD_SIZE.
    """

    name: str
    train_images: int
    val_images: int
    targets: tuple[float, float]
    target_sources: tuple[str, str]
    eval_every_samples: int
    max_epochs: int
    min_batch: int
    max_batch: int


@dataclass(frozen=True)
class Goals:
    """Issue 44's goals, judged on the medians over the scoring seeds."""

    adaptive_over_best_fixed: float = 1.05  # at every target
    adaptive_over_static_late: float = 0.85  # at the late target
    plan_adaptive_error: float = 0.20  # abs(the plan's adaptive row / measured adaptive - 1)


@dataclass(frozen=True)
class Protocol:
    workloads: tuple[WorkloadProtocol, ...]
    selection_seeds: tuple[int, ...] = (0, 1, 2)
    scoring_seeds: tuple[int, ...] = (3, 4, 5)
    bootstrap: Bootstrap = field(default_factory=Bootstrap)
    goals: Goals = field(default_factory=Goals)
    total_limit_s: float = 6 * 3600  # no run starts once the recorded runs' wall passes it
    version: int = PROTOCOL_VERSION


CNN = WorkloadProtocol(
    "fashion-mnist-cnn", train_images=10_000, val_images=5_000, targets=(0.80, 0.87),
    target_sources=(
        "time_to_accuracy.runs.jsonl (e4486ca): the CNN on a 10k subset at B = 32 scored "
        "78.4-82.5 % (median 81.0 %) on 10k held-out images after its first epoch",
        "time_to_accuracy.md: every B of 32-2048 reached 87 % in all 5 seeds (within 47 "
        "epochs); generalization.md: 20 epochs at B = 32 end at 88.1 % on the test set"),
    eval_every_samples=2_000, max_epochs=60, min_batch=32, max_batch=2048)
# No benchmark records resnet18's accuracy on Fashion-MNIST: its targets are the CNN's
# figures less 2 points for half the training images, a guess fixed before any run. Half
# the images, 2000 validation images and B <= 512 keep its runs (~9 ms a sample on two
# cores, noise-evolution's resnet18 trace: 345 s for 3 epochs of 10k) within the limit.
RESNET18 = WorkloadProtocol(
    "resnet18-fashion-mnist", train_images=5_000, val_images=2_000, targets=(0.78, 0.85),
    target_sources=("none recorded for resnet18: the CNN's 80 % less 2 points",
                    "none recorded for resnet18: the CNN's 87 % less 2 points"),
    eval_every_samples=1_250, max_epochs=10, min_batch=32, max_batch=512)
PROTOCOL = Protocol((CNN, RESNET18))
# --quick, a smoke test of the runner (not a measurement): one tiny workload, one seed that
# both selects and scores, low targets, two batches.
QUICK = Protocol((WorkloadProtocol(
    "fashion-mnist-cnn", train_images=512, val_images=256, targets=(0.30, 0.45),
    target_sources=("smoke test", "smoke test"), eval_every_samples=128, max_epochs=3,
    min_batch=64, max_batch=128),), selection_seeds=(0,), scoring_seeds=(0,),
    bootstrap=Bootstrap(resamples=100), total_limit_s=60)  # the smoke test's minute


def protocol_record(protocol: Protocol) -> dict:
    """The protocol as a run records it beside its results (what the report reads): the
    dataclasses' fields and this module's constants."""
    from dataclasses import asdict

    return {**asdict(protocol), "world_size": WORLD_SIZE, "strategy": STRATEGY,
            "time_measure": TIME_MEASURE, "data_seed": DATA_SEED, "val_start": VAL_START,
            "split_sha256": SPLIT_SHA256}


# --------------------------------------------------------------------------- the split

def pool_indices() -> list[int]:
    """The images no other benchmark uses, in the protocol's permuted order."""
    import torch

    taken = set(range(TAKEN_PREFIX)) | set(torch.randperm(
        TRAIN_SIZE, generator=torch.Generator().manual_seed(TAKEN_SUBSET_SEED))[
        :TAKEN_SUBSET].tolist())
    pool = [i for i in range(TRAIN_SIZE) if i not in taken]
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(DATA_SEED))
    return [pool[i] for i in order.tolist()]


def split_indices(workload: WorkloadProtocol) -> tuple[list[int], list[int]]:
    """(training, validation) indices into Fashion-MNIST's training set for `workload`."""
    pool = pool_indices()
    return (pool[:workload.train_images],
            pool[VAL_START:VAL_START + workload.val_images])


def split_digest() -> str:
    """sha256 of the pool's order (what every split is a slice of)."""
    return hashlib.sha256(",".join(map(str, pool_indices())).encode()).hexdigest()


# --------------------------------------------------------------------------- GPU projection

GPU_RESULTS_GLOB = "gpu_acceptance*.json"  # benchmarks/results/, *_quick* left out
GPU_WORKLOADS = {"fashion-mnist-cnn": "cnn", "resnet18-fashion-mnist": "resnet18"}
GPU_PRECISION = "fp32"  # what these runs train in


def gpu_step_seconds(recorded: list[dict], workload: str) -> dict[int, float]:
    """B -> seconds per step on the recorded GPU (gpu-acceptance's `rows`: one process,
    the whole global batch B, `GPU_PRECISION`), the median where several runs record one."""
    import statistics

    label = GPU_WORKLOADS.get(workload)
    found: dict[int, list[float]] = {}
    for result in recorded:
        for row in result.get("rows", []):
            if row.get("workload") == label and row.get("precision") == GPU_PRECISION \
                    and "step_s" in row:
                found.setdefault(int(row["global_batch"]), []).append(float(row["step_s"]))
    return {batch: statistics.median(times) for batch, times in sorted(found.items())}


def step_seconds_at(step_s: Mapping[int, float], batch: int) -> float | None:
    """The GPU's step time at `batch`: recorded, or log-log linear between the two recorded
    batches around it; None outside the recorded range (no extrapolation)."""
    if batch in step_s:
        return step_s[batch]
    below = [b for b in step_s if b < batch]
    above = [b for b in step_s if b > batch]
    if not below or not above:
        return None
    low, high = max(below), min(above)
    share = math.log(batch / low) / math.log(high / low)
    return math.exp(math.log(step_s[low]) + share * math.log(step_s[high] / step_s[low]))


def projected_seconds(steps_by_batch: Mapping[int, float],
                      step_s: Mapping[int, float]) -> tuple[float | None, str]:
    """A projection, not a measurement: the seconds one GPU of gpu-acceptance's kind would
    take for the optimizer steps these CPU runs measured to a target,

        T_gpu = sum over B of steps_to_target(B) x t_gpu(B),

    steps_by_batch: the steps a run trained at each B before reaching the target (a fixed
    run: one B; the adaptive run: its steps per B); t_gpu: `step_seconds_at`. It assumes
    the steps to a target depend on B alone (not on the hardware), one GPU running the
    whole global batch (no all-reduce), and leaves out evaluation, data loading past the
    step, start-up and the adaptive run's switching. Returns (seconds, "") or (None,
    "no projection: <why>") when no GPU step time is recorded or a B lies outside them.
    """
    if not step_s:
        return None, "no projection: no GPU step times recorded (run gpu-acceptance)"
    if not steps_by_batch:
        return None, "no projection: the run records no steps per batch"
    total = 0.0
    for batch, steps in steps_by_batch.items():
        if math.isinf(steps):
            return math.inf, ""
        at = step_seconds_at(step_s, batch)
        if at is None:
            return None, (f"no projection: B = {batch} outside the GPU's recorded batches "
                          f"{min(step_s)}-{max(step_s)}")
        total += steps * at
    return total, ""
