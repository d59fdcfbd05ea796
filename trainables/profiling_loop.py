"""The Ray Train per-worker loop that profiles one cluster size N at several global batches
(DESIGN "Data flow" step 3): one worker group, every batch the search assigned to N,
smallest first, one report (one Tune result) per (N, B).

A thin adapter: what it measures and how is `tula_ray.training.profile_sweep` (the
`Sweep` a worker group builds once, and the row of each batch) over the phases of
`tula_ray.training.profile_phases`, which run under any torch.distributed group. This
loop only says where the worker sits in Ray Train's group (`SweepWorker`: its rank,
device, node, and Ray Train's `prepare_model`) and reports each row to Tune.

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
     step (`profile_phases.strategy_extra_s`), one evaluation pass and one checkpoint
     write (`tula_ray.training.epoch_costs`): the epoch's costs beyond its steps.
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
its workers' distinct Ray node IDs, `profile_sweep.nodes_spanned`). Short steps are
cheap, so each phase takes at least `measure_steps` steps and more while they fit in
`measure_seconds` (up to `MAX_MEASURE_STEPS`): the mean of more steps has less spread.
Every worker takes the same number of steps (the count comes from the warm-up's
all-reduced step time), or DDP's collectives would wait for a step a worker never takes.
An out-of-memory batch ends the sweep: every larger local batch would run out too.
"""

from __future__ import annotations

import math
import time
from typing import Any

import ray
import ray.train
import ray.train.torch

from tula_ray.profile_table import STATUS_OOM
from tula_ray.space import ProfileGrid
from tula_ray.training.profile_settings import ProfileSettings
from tula_ray.training.profile_sweep import Sweep, SweepWorker, profile_batch
from tula_ray.verbosity import set_worker_log_level

# The loop config's keys of what the trial profiles (`ProfileGrid`) and how
# (`ProfileSettings`), both read once by the trial and sent typed.
PROFILE_GRID_KEY = "profile_grid"
SETTINGS_KEY = "settings"


def profile_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train loop: profile each batch of `config[PROFILE_GRID_KEY]` on this worker
    group, smallest first, and report one row per batch.

    config: profile_grid (the trial's `ProfileGrid`), settings (its `ProfileSettings`),
    cpus_per_worker (reported with the row), round, trial_started_at (time.time() when
    the trial started: the launch's wall time), train_log_level (the workers' logs:
    `tula_ray.verbosity`; default INFO).
    """
    set_worker_log_level(config.get("train_log_level", "INFO"))
    launch_s = time.time() - float(config.get("trial_started_at", time.time()))
    grid: ProfileGrid = config[PROFILE_GRID_KEY]
    settings: ProfileSettings = config[SETTINGS_KEY]
    sweep = Sweep(settings, this_worker(config.get("cpus_per_worker", math.nan)),
                  grid.first_batch, grid.last_batch)
    for global_batch in grid.global_batches:
        row = profile_batch(sweep, global_batch, launch_s=launch_s,
                            round_index=config.get("round", math.nan))
        ray.train.report(row)  # every worker reports (a barrier); rank 0's row is kept
        if row["status"] == STATUS_OOM:
            break  # memory per worker grows with b: every larger batch runs out too


def this_worker(cpus_per_worker: float = math.nan) -> SweepWorker:
    """This Ray Train worker's place in its group: rank, device, Ray node ID, and Ray
    Train's `prepare_model` (the device, DDP) for the models the phases wrap."""
    context = ray.train.get_context()
    return SweepWorker(world_size=context.get_world_size(), rank=context.get_world_rank(),
                       device=ray.train.torch.get_device(),
                       node=ray.get_runtime_context().get_node_id(),
                       prepare_model=ray.train.torch.prepare_model,
                       cpus_per_worker=cpus_per_worker)
