"""The Ray Train per-worker loop that profiles one cluster size N at several global batches
(DESIGN "Data flow" step 3): one worker group, every batch the search assigned to N,
smallest first, one report (one Tune result) per (N, B).

Phases for each batch, at local batch b = B / N on the workload's real data:
  1. warm-up, not timed (allocator, thread pools): the first step without a collective,
     after which the workers agree that it fitted in memory (`agree_first_step_fits`);
     on CPU the second step is memory's (MemTracker around one step of the worker's own
     model, whose optimizer state the first step made; a peak over `device_memory_bytes`
     ends the batch as "oom"); then synced steps up to `warmup_steps`;
  2. compute: steps under DDP's `no_sync()`: no all-reduce;
  3. synced: ordinary DDP steps;
  4. strategy (config "training_strategy"; once per worker group, after its first
     batch): what the training strategy adds to a step, measured, not assumed
     (`trainables.strategy_cost`), on the first row as `strategy_extra_s`.
Compute and synced steps are separate phases, not interleaved: with BatchNorm,
DDP broadcasts buffers in the forward after a synced step (NOTES-ENV).
Only the train step is timed; fetching the next batch is outside the timer.

The model, optimizer and data are built once per worker group: a further batch costs
its own steps, not a new launch. Short steps are cheap, so each phase takes at least
`measure_steps` steps and more while they fit in `measure_seconds` (up to
`MAX_MEASURE_STEPS`): the median of more steps has less spread. Every worker takes
the same number of steps (the count comes from the warm-up's all-reduced step time),
or DDP's collectives would wait for a step a worker never takes.
An out-of-memory batch ends the sweep: every larger local batch would run out too.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from typing import Any, Callable, Iterator

import ray.train
import ray.train.torch
import torch
from torch.utils.data import DataLoader

from trainables.step_timing import cycle, measured_step_count, spread as step_spread, timed_steps
from trainables.strategy_cost import measure_strategy_extra_s, strategy_batch
from tula_ray.distributed import max_over_ranks
from tula_ray.failures import is_out_of_memory, workload_code
from tula_ray.profile_table import MAX_ERROR_CHARS, STATUS_OK, STATUS_OOM, profile_row
from tula_ray.training.measure import memtracker_peak_bytes, train_step
from tula_ray.workloads import resolve_workload

logger = logging.getLogger(__name__)

WARMUP_STEPS_DEFAULT = 3
MEASURE_STEPS_DEFAULT = 5  # at least this many timed steps per phase
# ... and more while a phase takes less than this: cheap for short steps, where the
# median of a few steps is noisiest relative to the step (fixed costs, scheduler jitter).
MEASURE_SECONDS_DEFAULT = 1.0
SEED_DEFAULT = 0


def profile_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train loop: profile each of `config["global_batches"]` on this worker group,
    smallest first, and report one row per batch.

    config: workload (name or Workload), workload_options, global_batches (or one
    global_batch), warmup_steps, measure_steps, measure_seconds, device_memory_bytes
    (optional: a CPU peak above it is "oom"), measure_memory (default True), seed,
    round, trial_started_at (time.time() when the trial started: the launch's wall time).
    """
    context = ray.train.get_context()
    world_size = context.get_world_size()
    launch_s = time.time() - float(config.get("trial_started_at", time.time()))
    batches = sorted(int(b) for b in config.get("global_batches", [config.get("global_batch")]))
    sweep = _Sweep(config, world_size)
    for global_batch in batches:
        started = time.perf_counter()
        row = profile_row(world_size, global_batch, status=STATUS_OK)
        try:
            # The workload's own code fails as a UserCodeError (the search's taxonomy).
            with workload_code(sweep.workload.name, f"training at B={global_batch} on "
                                                    f"N={world_size} workers"):
                row.update(sweep.profile(global_batch))
        except RuntimeError as exc:  # torch's OOM, NCCL's (DistBackendError), or a peer's
            if not is_out_of_memory(exc):
                raise
            logger.warning("out of memory at B=%d N=%d: %s", global_batch, world_size, exc)
            row.update(status=STATUS_OOM,
                       error=f"{type(exc).__name__}: {exc}"[-MAX_ERROR_CHARS:])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        row.update(round=config.get("round", math.nan), launch_wall_s=launch_s,
                   profile_wall_s=time.perf_counter() - started)
        ray.train.report(row)  # every worker reports (a barrier); rank 0's row is kept
        if row["status"] == STATUS_OOM:
            break  # memory per worker grows with b: every larger batch runs out too


class PeerOutOfMemoryError(torch.OutOfMemoryError):
    """Another worker of the group ran out of memory at this batch."""


def agree_first_step_fits(step: Callable[[], list[float]], device: torch.device,
                          no_collective: contextlib.AbstractContextManager) -> list[float]:
    """Run `step` (one training step, inside `no_collective`: DDP's no_sync) on every
    worker, then agree over all workers whether it fitted in memory. Returns its timing;
    raises torch.OutOfMemoryError on EVERY worker when any one ran out, so that all of
    them mark the batch "oom" together instead of some waiting in a collective."""
    failure: BaseException | None = None
    seconds: list[float] = []
    with no_collective:
        try:
            seconds = step()
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            failure = exc
            if device.type == "cuda":
                torch.cuda.empty_cache()
    (any_failed,) = max_over_ranks([1.0 if failure else 0.0], device)
    if failure is not None:
        raise failure
    if any_failed:
        raise PeerOutOfMemoryError("out of memory on another worker of this group")
    return seconds


class _Sweep:
    """What a worker group builds once and reuses for every batch: workload, model, data."""

    def __init__(self, config: dict[str, Any], world_size: int) -> None:
        self.config, self.world_size = config, world_size
        self.warmup = int(config.get("warmup_steps", WARMUP_STEPS_DEFAULT))
        self.measure = int(config.get("measure_steps", MEASURE_STEPS_DEFAULT))
        self.budget_s = float(config.get("measure_seconds", MEASURE_SECONDS_DEFAULT))
        if self.warmup < 0 or self.measure < 1:
            raise ValueError(f"warmup_steps={self.warmup}, measure_steps={self.measure}; "
                             "need warmup_steps >= 0 and measure_steps >= 1")
        self.workload = resolve_workload(config["workload"], config.get("workload_options"))
        self.device = ray.train.torch.get_device()
        torch.manual_seed(int(config.get("seed", SEED_DEFAULT)))
        name = self.workload.name
        with workload_code(name, "train_dataset_fn()"):
            self.dataset = self.workload.train_dataset_fn()
        with workload_code(name, "model_fn()"):
            model = self.workload.model_fn()
        self.model = ray.train.torch.prepare_model(model)
        self.model.train()
        with workload_code(name, "optimizer_fn(model.parameters())"):
            self.optimizer = self.workload.optimizer_fn(self.model.parameters())
        with workload_code(name, "loss_fn()"):
            self.loss_fn = self.workload.loss_fn()
        self.first_batch = min(int(b) for b in config.get(
            "global_batches", [config.get("global_batch")]))
        self.strategy_batch, self.strategy_options = strategy_batch(
            config, world_size, self.first_batch, len(self.dataset))  # type: ignore[arg-type]

    def _cpu_peak(self, batches: Iterator) -> tuple[float, float]:
        """One untimed step of this worker's own model under MemTracker: its peak bytes,
        the largest over the workers, and the step's seconds. The wrapped module trains
        alone (no DDP hooks, no collective), on a real batch. The batch is fetched before
        the tracker and registered with it: a fetch inside would count the whole dataset's
        storage, which the batch's samples view."""
        module = getattr(self.model, "module", self.model)
        started = time.perf_counter()
        inputs, targets = next(batches)
        peak = memtracker_peak_bytes(
            [lambda: train_step(module, self.optimizer, self.loss_fn, inputs, targets)],
            module, self.optimizer, inputs, targets)
        seconds = time.perf_counter() - started
        (peak,) = max_over_ranks([float(peak)], self.device)
        return peak, seconds

    def profile(self, global_batch: int) -> dict[str, Any]:
        world_size, device, config = self.world_size, self.device, self.config
        if global_batch % world_size:
            raise ValueError(f"global_batch={global_batch} is not divisible by num_workers="
                             f"{world_size}; B must be a multiple of N")
        local_batch = global_batch // world_size
        # Diagnostics beside the profile fields: per-worker compute speed depends on them.
        result: dict[str, Any] = {"torch_threads": torch.get_num_threads(),
                                  "device": device.type,
                                  "cpus_per_worker": config.get("cpus_per_worker", math.nan)}

        limit = config.get("device_memory_bytes")
        if len(self.dataset) < global_batch:  # type: ignore[arg-type]
            raise ValueError(f"global_batch={global_batch} is larger than the dataset of "
                             f"{self.workload.name} ({len(self.dataset)} samples)")  # type: ignore[arg-type]
        loader = ray.train.torch.prepare_data_loader(
            DataLoader(self.dataset, batch_size=local_batch, shuffle=True, drop_last=True))
        batches = cycle(loader)
        model, optimizer, loss_fn = self.model, self.optimizer, self.loss_fn
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        # 1. Warm-up. One worker: no DDP wrapper, no collective, so the synced phase
        # would repeat the compute phase: sync = 0.
        distributed = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        # The first step, where memory peaks, runs without a collective and the workers
        # agree on whether it fitted: a worker out of memory inside DDP's all-reduce would
        # leave its peers waiting in it until the process-group timeout (issue 14, item 6).
        warm = agree_first_step_fits(
            lambda: timed_steps(1, batches, model, optimizer, loss_fn, device), device,
            model.no_sync() if distributed else contextlib.nullcontext())
        if device.type != "cuda" and config.get("measure_memory", True):
            peak, seconds = self._cpu_peak(batches)
            warm.append(seconds)
            result.update(peak_mem_bytes=peak, memory_source="memtracker")
            if limit is not None and peak > float(limit):
                return {**result, "status": STATUS_OOM,
                        "error": f"peak {peak:.4g} bytes > device_memory_bytes {float(limit):.4g}"}
        synced_warm = timed_steps(max(self.warmup - len(warm), 0), batches, model, optimizer,
                                   loss_fn, device)
        warm += synced_warm
        # The step count comes from an untracked step (MemTracker slows the one it watches).
        (warm_s,) = max_over_ranks([(synced_warm or warm[:1] or [math.nan])[-1]], device)
        steps = measured_step_count(warm_s, self.measure, self.budget_s)
        # 2-3. Compute-only, then synced.
        with model.no_sync() if distributed else contextlib.nullcontext():
            compute = timed_steps(steps, batches, model, optimizer, loss_fn, device)
        step = timed_steps(steps, batches, model, optimizer, loss_fn, device) if distributed \
            else compute

        if global_batch == self.first_batch and self.strategy_batch is not None:
            result["strategy_extra_s"] = measure_strategy_extra_s(self)
        medians = [statistics.median(compute), statistics.median(step), step_spread(step),
                   sum(compute) + (sum(step) if distributed else 0.0), sum(warm)]
        if device.type == "cuda":
            medians.append(float(torch.cuda.max_memory_allocated(device)))  # reduced[5]
        reduced = max_over_ranks(medians, device)
        compute_s, step_s, spread, timed_s, warm_s = reduced[:5]
        # Timing noise (~15 % here) can make the compute-only median exceed the
        # synced one when the collective is cheap; sync cannot be negative, so the
        # whole step is then compute and the row stays consistent: step = compute + sync.
        compute_s = min(compute_s, step_s)
        result.update(
            compute_time_s=compute_s, step_time_s=step_s, sync_time_s=step_s - compute_s,
            samples_per_s=global_batch / step_s, step_time_spread=spread,
            warmup_steps=self.warmup, measure_steps=steps, timed_wall_s=timed_s,
            warmup_wall_s=warm_s,
            status=STATUS_OK, error="")
        if device.type == "cuda":
            result.update(peak_mem_bytes=reduced[5], memory_source="cuda")
            # The user may declare a device smaller than this GPU.
            if limit is not None and reduced[5] > float(limit):
                result.update(status=STATUS_OOM, error=f"peak {reduced[5]:.4g} bytes > "
                                                       f"device_memory_bytes {float(limit):.4g}")
        return result
