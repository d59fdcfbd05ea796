"""The Tune trainable that profiles one cluster size N at several global batches with ONE
Ray Train TorchTrainer (one worker group; DESIGN "Data flow" step 3).

Train V2 (the default in Ray 2.60) does not accept `Tuner(trainer)`; the
supported pattern is a Tune function trainable that builds and fits a
TorchTrainer and forwards the workers' reports to Tune (`trainables.tune_reports`: from
the function's one thread, not `TuneReportCallback`'s two). The trial itself holds no
CPU but one unit of the custom `train_driver` resource (`tula_ray.cluster.trial_resources`).

    tune.Tuner(trainable_with_resources(), param_space={"num_workers": 2,
               "global_batches": [64, 256],
               **ProfileSettings(workload="fashion-mnist-cnn").to_config()}, ...)

What every trial of a search shares is its `ProfileSettings`
(`tula_ray.training.profile_settings`), one dict of the trial config, read typed once
here (`ProfileSettings.from_config`, which reads each setting spelled at the config's
top alike) and sent typed to the worker loop.

The trial reports one Tune result per batch, each a row with every
`tula_ray.profile_table.PROFILE_COLUMNS` field (so each shows in Tune's output and the
dashboard as it is measured); failures are rows with status "oom" or "error", never a
crashed search, each with its class in the search's one taxonomy (`tula_ray.failures`)
and the worker's traceback. Launches per search = trials = distinct N per round.

The worker group is placed as `tula_ray.train` will place it (issue 26, topology): N <=
the settings' workers_per_node (G, the most workers one node holds) on ONE node, a larger N
packed (`tula_ray.cluster.scaling_config`); each row records the nodes it spanned
(`num_nodes`).
"""

from __future__ import annotations

import functools
import logging
import math
import sys
import time
import traceback
from dataclasses import replace
from typing import Any, Callable

from ray import tune
from ray.train import FailureConfig, LoggingConfig, RunConfig
from ray.train.torch import TorchConfig, TorchTrainer

from trainables.profiling_loop import PROFILE_GRID_KEY, SETTINGS_KEY, profile_loop_per_worker
from trainables.tune_reports import TuneReports
from tula_ray.cluster import (PROVISION_TIMEOUT_S_DEFAULT, alive_node_resources, can_place,
                              hold_request, job_keeper, prompt_train_polls, scaling_config,
                              trial_resources, without_preemption_watcher, worker_shape,
                              workers_that_fit)
from tula_ray.failures import (FAILURE_INFRASTRUCTURE, FAILURE_OOM, FAILURE_USER_CODE,
                               UserCodeError, is_out_of_memory)
from tula_ray.models.topology import STRICT_PACK, node_bundles, placement_strategy
from tula_ray.profile_table import (LAUNCH_TOTAL_KEY, STATUS_ERROR, STATUS_OOM, TRACEBACK_KEY,
                                    profile_row)
from tula_ray.space import ProfileGrid, check_batch_in_dataset
from tula_ray.training.profile_settings import ProfileSettings
from tula_ray.verbosity import VERBOSE_DEFAULT, ray_log_level
from tula_ray.workloads import resolve_workload

logger = logging.getLogger(__name__)

# The keys of a trial config beside its grid (num_workers, global_batches) and its
# settings (`ProfileSettings.from_config`) that the worker loop takes: the search round
# (the row's) and when the trial started (the launch's wall time).
LOOP_KEYS = ("round", "trial_started_at")
# How long a trial waits for a lost node to come back (an autoscaler replacing it) before
# its cluster size is recorded as not placeable; the search's provision_timeout_s if shorter.
LOST_NODE_WAIT_S = 60.0
# The process group's timeout for a profiling trial (torch's default is 1800 s): a profiling
# step takes seconds, so a collective still waiting after this has lost a peer (a crash, a
# kill, an allocation failure past the agreed first step); the trial ends as an error
# row in minutes instead of half an hour.
COLLECTIVE_TIMEOUT_S = 180
# Tries Ray Train makes, after the first, to start a profiling trial's worker group (each
# waits RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s). A node lost just as the trial
# started passes `_cannot_place` and shows only here: fewer retries than training's
# (`tula_ray.cluster.WORKER_GROUP_START_RETRIES`, 10) keep that wait near LOST_NODE_WAIT_S
# (3 minutes, not 11, before its rows read "error" and the search goes on), and one
# retry more than none covers a slow start on a loaded machine.
PROFILING_START_RETRIES = 2


def trainable_with_resources(train_log_level: str | None = None) -> Callable:
    """`profile_cluster_size` wrapped with `trial_resources()`, ready for `tune.Tuner`; its
    trials' Ray Train logs at `train_log_level` (default WARNING: `tula_ray.verbosity`).
    The level travels with the trainable, not in the param space, so that a search resumed
    at another verbosity, or saved before there was one, restores the same params."""
    if train_log_level is None:
        return tune.with_resources(profile_cluster_size, trial_resources())

    @functools.wraps(profile_cluster_size)
    def at_log_level(config: dict[str, Any]) -> None:
        profile_cluster_size({**config, "train_log_level": train_log_level})

    return tune.with_resources(at_log_level, trial_resources())


def build_trainer(config: dict[str, Any], grid: ProfileGrid | None = None,
                  callbacks: list | None = None,
                  settings: ProfileSettings | None = None) -> TorchTrainer:
    """The TorchTrainer that runs `profile_loop_per_worker` for one cluster size.

    grid: what it profiles (N and its batches); default the config's (num_workers,
    global_batches: `ProfileGrid.of_config`). The loop takes it typed, and the config's
    `ProfileSettings` (`ProfileSettings.from_config`: the search's one dict, or each
    setting at the top) too: the workload, the steps, the training strategy, where the
    group is placed (use_gpu, default: the cluster has GPUs; resources_per_worker, one
    worker's as in Ray's ScalingConfig, default `tula_ray.cluster.worker_shape`'s one
    device; workers_per_node, G: N <= G runs on one node, a larger N packed,
    `tula_ray.cluster.scaling_config`, default None: Ray's PACK).
    config's own: storage_path (default: Ray's, ~/ray_results), train_log_level (Ray
    Train's logs, default WARNING: `tula_ray.verbosity`), round and trial_started_at.
    settings: the config's, when the caller has read them already.
    """
    grid = grid or ProfileGrid.of_config(config)
    settings = settings or ProfileSettings.from_config(config)
    num_workers = grid.num_workers
    resources = worker_shape(settings.resources_per_worker, use_gpu=settings.use_gpu)
    loop_config = {key: config[key] for key in LOOP_KEYS if key in config}
    loop_config.update({PROFILE_GRID_KEY: grid, SETTINGS_KEY: settings,
                        "cpus_per_worker": resources.get("CPU", 0.0)})  # with the row
    # Ray Train's controller and workers log at it (`tula_ray.verbosity`); the loop too
    loop_config["train_log_level"] = config.get("train_log_level",
                                                ray_log_level(VERBOSE_DEFAULT))
    name = f"profile-N{num_workers}-B{'-'.join(str(b) for b in grid.global_batches)}"
    return TorchTrainer(
        profile_loop_per_worker,
        train_loop_config=loop_config,
        torch_config=TorchConfig(timeout_s=COLLECTIVE_TIMEOUT_S),
        scaling_config=scaling_config(num_workers, resources, settings.workers_per_node),
        run_config=RunConfig(
            name=name, storage_path=config.get("storage_path"), callbacks=callbacks or [],
            # A failed candidate is a measurement (status "error"), not a reason to retry;
            # a group that keeps failing to start is one too (its rows become errors).
            failure_config=FailureConfig(
                max_failures=0, controller_failure_limit=PROFILING_START_RETRIES),
            logging_config=LoggingConfig(log_level=loop_config["train_log_level"])),
    )


def profile_cluster_size(config: dict[str, Any]) -> None:
    """Tune function trainable: profile config["num_workers"] at each config["global_batches"].

    Reports one row per batch to Tune: from the workers (`TuneReports`) as each
    batch is measured; directly for a batch that cannot run (found without starting
    workers) and, should the worker group fail, for every batch (the searcher keeps a
    batch's first row, so the ones already measured stay measured).
    """
    without_preemption_watcher()  # it never restarts: a lost node makes its rows errors
    prompt_train_polls()
    _quiet_termination()
    settings = ProfileSettings.from_config(config)  # read once here, as its batches
    grid = _runnable(ProfileGrid.of_config(config), settings)
    if not grid.global_batches:
        return
    num_workers, runnable = grid.num_workers, list(grid.global_batches)
    missing = _cannot_place(num_workers, settings)
    if missing:  # a node lost since the search started: record it, go on with other N
        logger.warning("cluster size N=%d not profiled: %s", num_workers, missing)
        for global_batch in runnable:
            tune.report(profile_row(num_workers, global_batch, error=missing,
                                    failure=FAILURE_INFRASTRUCTURE))
        return
    # The launch's wall time starts once its nodes are there: waiting for an autoscaler is
    # the search's, not a `train` launch's (train provisions before it starts its group).
    started_at = time.time()
    # The Train run is stored inside its Tune trial unless the config names a place.
    config = {**config, "trial_started_at": started_at,
              "storage_path": config.get("storage_path") or tune.get_context().get_trial_dir()}
    try:
        # Every report from this thread (`trainables.tune_reports`), the workers' included.
        reports = TuneReports()
        reports.fit(build_trainer(config, grid, callbacks=reports.callbacks, settings=settings))
    except Exception as exc:  # noqa: BLE001 - any failure is a row, never a crash
        failure, message, trace = describe_failure(exc)
        status = STATUS_OOM if failure == FAILURE_OOM else STATUS_ERROR
        logger.warning("cluster size N=%d failed at batches %s (%s): %s", num_workers,
                       runnable, failure, message)
        for global_batch in runnable:  # the searcher keeps a batch's first row
            tune.report({**profile_row(num_workers, global_batch, status=status,
                                       error=message, failure=failure),
                         "num_nodes": _placed_nodes(num_workers, settings),
                         TRACEBACK_KEY: trace})
    else:
        # The whole launch, its end included (the worker group's and Ray Train's shutdown):
        # what a `train` job of this N waits for beyond its epochs, once the searcher has
        # taken the candidates' own time off (the search metric, NaN: no candidate).
        tune.report({LAUNCH_TOTAL_KEY: time.time() - started_at, "step_time_s": math.nan})


def _runnable(grid: ProfileGrid, settings: ProfileSettings) -> ProfileGrid:
    """The grid of the batches that can run, a row reported for each that cannot (found
    without starting workers: no need to start N workers to learn it)."""
    runnable = []
    for global_batch in grid.global_batches:
        problem = _infeasible(grid.num_workers, global_batch, settings)
        if problem:
            tune.report(profile_row(grid.num_workers, global_batch, error=problem,
                                    failure=FAILURE_INFRASTRUCTURE))
        else:
            runnable.append(global_batch)
    return replace(grid, global_batches=tuple(runnable))


def _quiet_termination() -> None:
    """Leave out the report of the SystemExit that ends this trial's process.

    Tune ends a finished trial's actor with SIGTERM, on which Ray's handler raises
    SystemExit. When the signal lands while the garbage collector runs a weakref callback
    (a WeakSet's `_remove`), Python cannot raise there and prints "Exception ignored in
    ... SystemExit: 1" with a traceback, now and then, after the trial has reported
    everything. Nothing is lost: the process ends as it would. Other exceptions Python
    cannot raise print as before."""
    previous = sys.unraisablehook
    if getattr(previous, "ends_trial_quietly", False):  # set by an earlier trial here
        return

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not SystemExit:
            previous(unraisable)

    hook.ends_trial_quietly = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _placed_nodes(num_workers: int, settings: ProfileSettings) -> float:
    """The nodes a failed worker group spanned, where its placement fixes them: one for
    N <= G (STRICT_PACK); NaN for a packed N, which Ray spreads as it finds room."""
    strict = placement_strategy(num_workers, settings.workers_per_node) == STRICT_PACK
    return 1.0 if strict else math.nan


def describe_failure(error: BaseException) -> tuple[str, str, str]:
    """(class, "Type: message", traceback) of a failed worker group, in the search's one
    taxonomy (`tula_ray.failures`): the worker whose error says most (the workload's own
    code, then out of memory, then the rest: a peer's collective error is a consequence).

    Ray Train V2 raises a WorkerGroupError whose `worker_failures` hold each rank's
    exception, wrapped with the worker's traceback (its `_base_exc` is the exception)."""
    failures = list(getattr(error, "worker_failures", {}).values()) or [error]
    described = []
    for failure in failures:
        original = getattr(failure, "_base_exc", failure)
        if isinstance(original, UserCodeError):
            kind, message = FAILURE_USER_CODE, original.message
        else:
            message = f"{type(original).__name__}: {original}"
            kind = FAILURE_OOM if is_out_of_memory(message) else FAILURE_INFRASTRUCTURE
        trace = str(failure) if failure is not original else "".join(
            traceback.format_exception(failure))
        described.append((kind, message, trace))
    order = (FAILURE_USER_CODE, FAILURE_OOM, FAILURE_INFRASTRUCTURE)
    return min(described, key=lambda d: order.index(d[0]))


def _cannot_place(num_workers: int, settings: ProfileSettings) -> str:
    """Why the cluster cannot hold N workers now, placed as the trial places them (N <= G on
    one node; `tula_ray.cluster.can_place`), "" when it can, after waiting for them.

    On an autoscaling cluster (the driver holds a request through its keeper) this round's
    N becomes the request, so the autoscaler adds its nodes, or lets a larger N's go idle,
    and they are waited for as long as the search's provision_timeout_s. Otherwise the
    search checked that the cluster held them when it started, and a node lost since then
    is waited for at most LOST_NODE_WAIT_S (the Train run would wait forever)."""
    worker = worker_shape(settings.resources_per_worker, use_gpu=settings.use_gpu)
    per_node = settings.workers_per_node
    given_s = settings.provision_timeout_s
    keeper = job_keeper()
    if keeper is not None:
        hold_request(keeper, node_bundles(worker, num_workers, per_node))
        wait_s = PROVISION_TIMEOUT_S_DEFAULT if given_s is None else float(given_s)
    else:
        wait_s = min(LOST_NODE_WAIT_S if given_s is None else float(given_s), LOST_NODE_WAIT_S)
    deadline = time.monotonic() + wait_s
    while not can_place(worker, num_workers, per_node, nodes := alive_node_resources()):
        if time.monotonic() >= deadline:
            return _not_placed(worker, num_workers, per_node, nodes, wait_s)
        time.sleep(1.0)
    return ""


def _not_placed(worker: dict[str, float], num_workers: int, per_node: int | None,
                nodes: list[dict[str, float]], wait_s: float) -> str:
    """`_cannot_place`'s message: what the nodes hold, against what N needs."""
    held = workers_that_fit(worker, nodes)
    if held >= num_workers:  # enough in all, but N <= G must share one node
        most = max((workers_that_fit(worker, [node]) for node in nodes), default=0)
        now = (f"no node holds the N={num_workers} workers of {worker} that run on one node "
               f"(a cluster size <= {per_node}, the most one node holds, is profiled on one "
               f"node as it will be trained); the largest holds {most} now")
    else:
        now = (f"the cluster holds {held} workers of {worker} now, fewer than "
               f"N={num_workers}")
    return (f"{now} (a node lost since the search started, or not added by the autoscaler?),"
            f" after waiting {wait_s:.0f} s "
            "for it; the search goes on with the other cluster sizes. Run the search again "
            "once the nodes are back to profile this one")


def _infeasible(num_workers: int, global_batch: int, settings: ProfileSettings) -> str:
    """Why the candidate cannot run, found without starting workers ("" when it can)."""
    if num_workers < 1 or global_batch < 1:
        return (f"num_workers={num_workers}, global_batch={global_batch}; "
                "both must be positive integers")
    if global_batch % num_workers:
        return (f"global_batch={global_batch} is not divisible by num_workers={num_workers}; "
                "B must be a multiple of N")
    try:  # cheap: builds no model and loads no data
        workload = resolve_workload(settings.workload, settings.workload_options)
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    try:  # a built-in's size is known without its data
        check_batch_in_dataset("global_batch", global_batch, workload.name, workload.train_size)
    except ValueError as exc:
        return str(exc)
    return ""

