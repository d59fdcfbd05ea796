"""The Ray Train per-worker loop that profiles one cluster size N at several global batches
(DESIGN "Data flow" step 3): one worker group, every batch the search assigned to N,
smallest first, one report (one Tune result) per (N, B).

Each step is the one `tula_ray.train` takes in an epoch (issue 24): the next batch of
the one data path (`tula_ray.training.batches`, placed on the device once per worker
group), the step, the epoch's running sums (`EpochTally.step`), so the plan's epoch time
is what `train`'s `seconds` measures. Phases for each batch, at local batch b = B / N:
  1. warm-up, not timed for the plan: the first step without a collective, after which
     the workers agree that it fitted in memory (`agree_first_step_fits`); on CPU the
     second step is memory's (MemTracker around one step of the worker's own model,
     whose optimizer state the first step made; a peak over `device_memory_bytes` ends
     the batch as "oom"); then `no_sync` steps until at least `warmup_steps` ran and
     `warmup_seconds` passed (a GPU's clocks ramp up), and one synced step;
  2-3. compute (steps under DDP's `no_sync()`: no all-reduce) and synced (ordinary DDP
     steps), in alternating blocks, so that a drift of the machine's speed (clocks,
     other load) falls on both alike; with BatchNorm a block's first step is untimed,
     DDP broadcasting buffers in the forward after a synced step only (NOTES-ENV);
     steps are marked as they are queued (`tula_ray.training.step_timing`), with no host
     sync inside a block; a phase's time is the mean step, as an epoch adds them up;
  4. untimed: the gradient noise at this batch (`tula_ray.training.gradient_noise`),
     pairs of a b-sample and a B-sample gradient of the same weights, whose squared norms
     give the row's grad_sqr and grad_var (issue 25);
  5. once per worker group, after its first batch: what the training strategy adds to a
     step (`trainables.strategy_cost`), one evaluation pass and one checkpoint write
     (`tula_ray.training.epoch_costs`): the epoch's costs beyond its steps.
Every phase ends with the workers' agreement (`tula_ray.training.phase_agreement`): a
failure on one worker raises on all of them at the same point, with the same class, so
that out of memory anywhere makes the row "oom" on every worker (`profile_batch`), and
any other failure ends the worker group as the driver sorts it (user code or
infrastructure). The training steps' peak memory is read before phase 4 (the noise's
gradients, the strategy's second model are not `train`'s), and checked against
`device_memory_bytes` with DDP's buckets and NCCL's buffers counted once
(`tula_ray.models.memory.over_budget`; NCCL's measured at the group's first collective).

The model, optimizer and data are built once per worker group: a further batch costs
its own steps, not a new launch. So are the nodes the group spans (the row's `num_nodes`:
its workers' distinct node IDs, `profiling_sweep.nodes_spanned`). Short steps are cheap,
so each phase takes at least `measure_steps` steps and more while they fit in
`measure_seconds` (up to `MAX_MEASURE_STEPS`): the mean of more steps has less spread.
Every worker takes
the same number of steps (the count comes from the warm-up's all-reduced step time),
or DDP's collectives would wait for a step a worker never takes.
An out-of-memory batch ends the sweep: every larger local batch would run out too.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import ray.train
import torch

from trainables.profiling_sweep import Sweep
from tula_ray.failures import is_out_of_memory, workload_code
from tula_ray.profile_table import (FAILURE_OOM, MAX_ERROR_CHARS, STATUS_OK, STATUS_OOM,
                                    profile_row)
from tula_ray.space import ProfileGrid
from tula_ray.verbosity import set_worker_log_level

logger = logging.getLogger(__name__)

# The loop config's key of what the trial profiles (`ProfileGrid`, read once by the trial).
PROFILE_GRID_KEY = "profile_grid"


def profile_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train loop: profile each batch of `config[PROFILE_GRID_KEY]` on this worker
    group, smallest first, and report one row per batch.

    config: workload (name or Workload), workload_options, profile_grid (the trial's
    `ProfileGrid`), warmup_steps, warmup_seconds, measure_steps, measure_seconds,
    device_memory_bytes
    (optional: a peak above it is "oom"), measure_memory (default True), seed,
    round, trial_started_at (time.time() when the trial started: the launch's wall time),
    train_log_level (the workers' logs: `tula_ray.verbosity`; default INFO).
    """
    set_worker_log_level(config.get("train_log_level", "INFO"))
    context = ray.train.get_context()
    world_size = context.get_world_size()
    launch_s = time.time() - float(config.get("trial_started_at", time.time()))
    grid: ProfileGrid = config[PROFILE_GRID_KEY]
    sweep = Sweep(config, world_size, grid.first_batch)
    for global_batch in grid.global_batches:
        row = profile_batch(sweep, global_batch, launch_s)
        ray.train.report(row)  # every worker reports (a barrier); rank 0's row is kept
        if row["status"] == STATUS_OOM:
            break  # memory per worker grows with b: every larger batch runs out too


def profile_batch(sweep: Sweep, global_batch: int, launch_s: float = math.nan) -> dict[str, Any]:
    """This worker's row for `global_batch`: measured, or "oom" (failure "oom") when any
    worker of the group ran out of memory (the phases' agreement raises it on all);
    any other failure is raised, the workload's own as a UserCodeError."""
    world_size = sweep.world_size
    started = time.perf_counter()
    row = profile_row(world_size, global_batch, status=STATUS_OK)
    row["num_nodes"] = sweep.num_nodes  # an "oom" row's too: where it ran out
    try:
        # The workload's own code fails as a UserCodeError (the search's taxonomy).
        with workload_code(sweep.workload.name, f"training at B={global_batch} on "
                                                f"N={world_size} workers"):
            row.update(sweep.profile(global_batch))
    except RuntimeError as exc:  # torch's OOM, NCCL's (DistBackendError), or a peer's
        if not is_out_of_memory(exc):
            raise
        logger.warning("out of memory at B=%d N=%d: %s", global_batch, world_size, exc)
        row.update(status=STATUS_OOM, failure=FAILURE_OOM,
                   error=f"{type(exc).__name__}: {exc}"[-MAX_ERROR_CHARS:])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    row.update(round=sweep.config.get("round", math.nan), launch_wall_s=launch_s,
               profile_wall_s=time.perf_counter() - started)
    return row
