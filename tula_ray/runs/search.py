"""`tula_ray.search()`: memory probe -> bounded space -> Tune trials -> Plan (DESIGN "Data flow").

The search entry point (Ray-facing): it orchestrates. The bounds are decided in
`tula_ray.planning.bounds`, the rounds in the search strategy (`searchers.TulaSearcher`
over it), the plan in `tula_ray.planning.plan`; cluster concerns in `tula_ray.cluster`.
It never imports the training entry point.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Sequence

import ray

from searchers import TulaSearcher
from trainables.memory_probe import check_max_local_batch, probe_memory, timed_check_workload
from tula_ray.cluster import (CPU_MEMORY_SHARE_DEFAULT, PROVISION_TIMEOUT_S_DEFAULT, Workers,
                              check_worker_request, cluster_for_run, node_memory_bytes)
from tula_ray.failures import UserCodeError
from tula_ray.models import memory as memory_model
from tula_ray.models.perf import COLLECTIVE_DEFAULT
from tula_ray.models.pricing import NodeBilling, Pricing
from tula_ray.planning.accuracy import REFERENCE_BATCH_DEFAULT
from tula_ray.planning.bounds import (MemoryProbe, SearchBounds, bounded_space, candidate_space,
                                      check_evaluation_fits, memory_budget_bytes,
                                      probe_min_local_batch)
from tula_ray.planning.context import OBJECTIVE_DEFAULT, PRICING_DEFAULT, PlanContext
from tula_ray.planning.plan import Plan, build_plan, renamed_search_strategy
from tula_ray.planning.policy import WEIGHT_TIME_DEFAULT
from tula_ray.planning.search_cost import search_cost
from tula_ray.planning.search_strategies import (SEARCH_STRATEGY_DEFAULT, topology_options,
                                                 with_plan_context)
from tula_ray.profile_table import STATUS_OK, profile_frame
from tula_ray.runs.search_experiment import (check_same_search, experiment_name,
                                             experiment_path, recorded_bounds, resume_record,
                                             run_experiment, saved_search, storage_root,
                                             trial_param_space)
from tula_ray.runs.search_request import (SearchRequest, check_dataset_size,
                                          check_search_arguments, json_options, search_identity,
                                          search_request)
from tula_ray.space import MIN_BATCH_DEFAULT, SearchSpace
from tula_ray.training.profile_settings import (MEASURE_SECONDS_DEFAULT, MEASURE_STEPS_DEFAULT,
                                                WARMUP_STEPS_DEFAULT, ProfileSettings)
from tula_ray.training.strategies import (TRAINING_STRATEGY_DEFAULT, plain_steps,
                                          portable_training_strategy, refusals)
from tula_ray.training.strategy_base import TrainingStrategy
from tula_ray.verbosity import VERBOSE_DEFAULT
from tula_ray.workloads import Workload, portable_workload

logger = logging.getLogger(__name__)


def search(
    workload: str | Workload = "fashion-mnist-cnn",
    *,
    cluster_sizes: Sequence[int] = (1, 2),
    min_batch: int = MIN_BATCH_DEFAULT,
    max_batch: int | None = None,
    objective: str = OBJECTIVE_DEFAULT,
    search_strategy: str = SEARCH_STRATEGY_DEFAULT,
    pricing: Pricing | str | dict = PRICING_DEFAULT,
    weight_time: float = WEIGHT_TIME_DEFAULT,
    device_memory_gb: float | None = None,
    headroom: float = memory_model.HEADROOM_DEFAULT,
    collective: str = COLLECTIVE_DEFAULT,
    warmup_steps: int = WARMUP_STEPS_DEFAULT,
    measure_steps: int = MEASURE_STEPS_DEFAULT,
    storage_path: str | None = None,
    name: str | None = None,
    workload_options: dict[str, Any] | None = None,
    epochs: int | None = None,
    strategy_options: dict[str, Any] | None = None,
    measure_seconds: float = MEASURE_SECONDS_DEFAULT,
    address: str | None = None,
    strategy: str | None = None,
    mode: str | None = None,
    resources_per_worker: dict[str, float] | None = None,
    provision_timeout_s: float = PROVISION_TIMEOUT_S_DEFAULT,
    resume: bool = False,
    training_strategy: str | TrainingStrategy | None = TRAINING_STRATEGY_DEFAULT,
    training_options: dict[str, Any] | None = None,
    runtime_env: dict[str, Any] | None = None,
    precision: str | None = None,
    reference_batch: int = REFERENCE_BATCH_DEFAULT,
    noise_scale: float | None = None,
    verbose: int = VERBOSE_DEFAULT,
) -> Plan:
    """Profile candidates on Ray, fit the models, and return the Plan with the choice.

    workload: a built-in name (see tula_ray.workloads.WORKLOADS) or a Workload;
      workload_options go to the built-in (data, train_subset, epochs, ...).
    cluster_sizes: the N to consider; each must fit the cluster's GPUs (or CPUs).
    min_batch, max_batch: global batch bounds; the memory probe lowers max_batch
      to what one device holds (times the largest N), and the dataset size caps it.
      A local batch the workload's own code fails at, once a smaller one ran, is the
      model's own limit: a bound as out of memory is (a warning names the max_batch
      that would skip the check; the plan's infeasible_reason names the error).
    search_strategy: the search strategy (tula_ray.planning.search_strategies.SEARCH_STRATEGIES):
      "partial" profiles only the extremes, "full" every candidate; strategy_options go to
      it. `strategy` and `mode` are its former names (deprecated, removed in tula-ray 0.3.0:
      `train`'s strategy is the training strategy, and Ray's `mode` means min/max).
    objective, weight_time, pricing: see tula_ray.planning.policy.choose and tula_ray.models.pricing.
      "time_to_accuracy", "cost_to_accuracy" and "knee_to_accuracy" rank each candidate
      by the epochs it needs to reach what `epochs` reach at `reference_batch` (M0),
      from the gradient noise every profile row measures (tula_ray.planning.accuracy),
      or from `noise_scale`: phi at the target accuracy, if you measured it on a model
      trained to it (`tula_ray.measure_noise_scale`); the profiles' phi is a barely
      trained model's, and phi grows as a model trains.
    device_memory_gb: memory of one device; GPUs report theirs, on CPU this is the
      share of RAM a worker may use (default 25 % of the node's RAM).
    storage_path, name: where Ray Tune keeps the experiment (default ~/ray_results).
    resume: continue the search `name` saved under `storage_path` if there is one (a
      driver that was killed): finished candidates are not profiled again and the memory
      probe is not rerun; the other arguments must be those of the saved search. Without
      a saved search it starts one.
    epochs: E of eq. 4a, the training the plan predicts (default the workload's).
    precision: "fp32", "tf32", "bf16" or "fp16" (`tula_ray.precision`), what every profiled step
      computes in and what `train` takes from the plan; default the workload's ("fp32").
    warmup_steps, measure_steps, measure_seconds: per batch, untimed steps, then at least
      measure_steps timed steps per phase, more while they fit in measure_seconds.
    One Ray Train worker group per cluster size and round profiles all of its batches.
    address: the Ray cluster to join ("auto": the one this machine belongs to); default
      $RAY_ADDRESS, else a new local Ray on loopback (see tula_ray.cluster.ensure_ray).
      A Ray this process already initialised is used as it is.
    resources_per_worker: one worker's resources as in Ray's ScalingConfig, e.g.
      {"CPU": 4}; default one device per worker (a GPU when the cluster has or can add
      GPUs, else a CPU), so N counts devices.
    provision_timeout_s: how long to wait for an autoscaler to add the nodes the largest
      cluster size needs (see tula_ray.cluster.provision_workers).
    training_strategy, training_options: what you will train the plan with (as
      `tula_ray.train`'s strategy and strategy_options; default train's). Each worker
      group also times the strategy's steps at one batch, and the plan's training times
      include what it adds per step (AGS's scales, syncs, all-reduces). None: plain SGD.
    runtime_env: the Ray runtime environment of the job, which every task, trial and
      worker inherits: your own modules (py_modules, working_dir), environment variables
      (env_vars, e.g. NCCL_DEBUG), pip packages; see tula_ray.cluster.ensure_ray.
    On a multi-node cluster storage_path must be reachable from every node (a shared
    file system or a cloud URI); the search refuses otherwise, before any trial.
    verbose: what the search prints (`tula_ray.verbosity`): 1 (the default) a line naming
      the Ray dashboard, a line per worker group (the candidates done and left) and per
      finished candidate (its step time, or its failure); 0 nothing but errors and
      warnings; 2 everything Ray prints too (Ray's start, Tune's boxes, Ray Train's INFO
      logs with each report's dict). Errors and warnings print at every level, and the
      dashboard shows every trial at every level. A resumed search's Tune output is the
      one it started with (Tune restores it with the experiment).

    Before any worker group starts, one Ray task with a worker's resources checks the
    workload where the workers run (`tula_ray.workloads.check`: its data, model, loss and
    optimizer on its first samples): its own code failing there raises a
    `tula_ray.failures.UserCodeError` with the worker's traceback. Failures while
    profiling follow one taxonomy (`tula_ray.failures`): out of memory makes a candidate
    infeasible, the infrastructure's an error row, and the workload's own code (or the
    same error ending two launches) ends the search with a UserCodeError, the rows so
    far kept in its experiment. `plan.meta["errors"]` lists each distinct error once.
    """
    check_search_arguments(locals())
    # here: its warning names the caller's line
    search_strategy = renamed_search_strategy(search_strategy, strategy, mode)
    request = search_request(locals())  # every argument, by name, into one checked value
    resources = check_worker_request(resources_per_worker, provision_timeout_s)
    # One worker now, for the probe: each round's trial asks for its own N when it starts
    # (smallest first), so no node idles while a smaller N is profiled (issue 45).
    with cluster_for_run(request.cluster_sizes[-1], resources, address=address,
                         runtime_env=runtime_env, storage_path=request.storage_path,
                         timeout_s=provision_timeout_s, verbose=verbose,
                         first_workers=1) as workers:
        name = experiment_name(request.name, request.workload.name)
        saved_at = experiment_path(request.storage_path, name)
        saved = saved_search(saved_at) if resume else None
        started = time.perf_counter()
        if saved is None:  # 1-2. probe, bound
            request, bounds = _probe_and_bound(request, workers)
            probe_s = time.perf_counter() - started
        else:
            request, bounds = _restored(request, saved, saved_at, workers)
            probe_s = 0.0
        plan_context = _plan_context(request, bounds.space, bounds.probe,
                                     workers.workers_per_node)
        # 3. the rounds of profiling trials
        record = resume_record(bounds, workers.use_gpu, probe_s, search_identity(request))
        param_space = trial_param_space(_profile_settings(request, bounds, workers), saved)
        searcher, path = _profile(request, bounds, plan_context, param_space, name, resume,
                                  record, verbose)
        _raise_deciding_error(searcher, path)
        # 4. the plan
        profiles = profile_frame(searcher.profiles)
        timings = {"probe_wall_s": probe_s,
                   "profiling_wall_s": time.perf_counter() - started - probe_s}
        meta = _meta(request, bounds, searcher, path, workers, saved is not None, timings)
        return build_plan(bounds.space, profiles, plan_context,
                          search_strategy=request.search_strategy, meta=meta)


def _probe_and_bound(request: SearchRequest, workers: Workers
                     ) -> tuple[SearchRequest, SearchBounds]:
    """DESIGN steps 1-2: the workload checked and the memory probe run on one worker
    (Ray), then the bounds (`tula_ray.planning.bounds`): one device's budget, the
    candidates up to the cap, the bound checked on the worker, the space up to it.
    Returns the request with its workload completed."""
    sizes, use_gpu = request.cluster_sizes, workers.use_gpu
    probe = probe_memory(request.spec, request.options,
                         min_local_batch=probe_min_local_batch(request.min_batch, sizes),
                         resources=workers.resources, use_gpu=use_gpu,
                         training_strategy=None if request.training_strategy is None
                         else portable_training_strategy(request.training_strategy),
                         training_options=request.training_options)
    request = _checked(request, probe.workload)
    device_bytes = memory_budget_bytes(
        probe, declared_gb=request.device_memory_gb, num_workers=sizes[-1], use_gpu=use_gpu,
        cpu_share_bytes=CPU_MEMORY_SHARE_DEFAULT * node_memory_bytes())
    check_evaluation_fits(probe, device_bytes, headroom=request.headroom)
    candidates = candidate_space(sizes, min_batch=request.min_batch,
                                 max_batch=request.max_batch,
                                 dataset_size=request.workload.dataset_size)
    probe = check_max_local_batch(probe, device_bytes, headroom=request.headroom,
                                  space=candidates, resources=workers.resources,
                                  use_gpu=use_gpu)
    space = bounded_space(candidates, probe.max_local_batch, min_batch=request.min_batch,
                          device_bytes=device_bytes, headroom=request.headroom)
    return request, SearchBounds(space, probe, device_bytes)


def _restored(request: SearchRequest, saved: TulaSearcher, saved_at: str, workers: Workers
              ) -> tuple[SearchRequest, SearchBounds]:
    """A saved search's bounds (no memory probe runs again), once its arguments match the
    saved ones, with the workload checked on a worker (timed: what `train` waits for)."""
    check_same_search(saved.resume_record.get("request", {}), search_identity(request),
                      saved_at)
    checked, check_s = timed_check_workload(
        request.spec, request.options, resources=workers.resources, use_gpu=workers.use_gpu)
    request = _checked(request, checked)
    bounds = recorded_bounds(saved.resume_record)
    bounds.probe.check_s = check_s
    return request, bounds


def _checked(request: SearchRequest, workload: Workload) -> SearchRequest:
    """The request with its workload completed by the check on a worker: a user's
    Workload travels to the trials completed, so no worker looks at its data again."""
    spec, options = portable_workload(request.spec, request.options, workload)
    request = replace(request, workload=workload, spec=spec, options=options)
    check_dataset_size(request)
    return request


def _meta(request: SearchRequest, bounds: SearchBounds, searcher: TulaSearcher, path: str,
          workers: Workers, resumed: bool, timings: dict[str, float]) -> dict[str, Any]:
    """What the plan records of its search besides its context: the wall times, the
    launches and rounds, what they cost in node-hours, the memory probe, the errors, and
    what `train` takes from it."""
    probe, use_gpu = bounds.probe, workers.use_gpu
    # A resumed search's probe ran in the driver that started it: its record keeps the time.
    probe_s = searcher.resume_record.get("probe_wall_s", timings["probe_wall_s"])
    cost = search_cost(searcher.sweeps, probe_s,
                       NodeBilling(request.pricing, workers.workers_per_node))
    return {"probe_wall_s": timings["probe_wall_s"], "workload_check_s": probe.check_s,
            "search_cost": cost,
            "profiling_wall_s": timings["profiling_wall_s"],
            "trials": len(searcher.sweeps), "launches": len(searcher.sweeps),
            "rounds": searcher.rounds, "stop_reason": searcher.stop_reason,
            "sweeps": searcher.sweeps, "candidates_profiled": len(searcher.profiles),
            "device_memory_bytes": bounds.device_memory_bytes,
            "max_local_batch": probe.max_local_batch, "use_gpu": use_gpu,
            "ray_version": ray.__version__, "experiment_path": path,
            "resumed": resumed,
            "memory_probe": probe.rows, "errors": searcher.errors,
            "batch_limit": None if probe.batch_limit is None else probe.batch_limit.to_dict(),
            "workload_options": json_options(request.workload_options),
            "precision": request.workload.precision,
            "training_strategy": request.training_strategy_name,
            "training_options": json_options(request.training_options)}


def _raise_deciding_error(searcher: TulaSearcher, path: str) -> None:
    """End the search with the error that stopped it (the workload's own code, or the same
    error on two launches), its worker traceback, and where the rows so far are kept."""
    fatal = searcher.deciding_error
    if fatal is None:
        return
    where = ", ".join(f"N={n} B={b}" for n, b in fatal["candidates"])
    kept = sum(1 for row in searcher.profiles if row["status"] == STATUS_OK)
    raise UserCodeError(
        f"{fatal['error']} (on {where}); the search stopped: this error would end every "
        f"candidate the same way. Its {len(searcher.profiles)} rows so far ({kept} ok) are "
        f"kept in the experiment at {path}", fatal["traceback"])


def _training_limits(request: SearchRequest, space: SearchSpace
                     ) -> tuple[dict[tuple[int, int], str], set[tuple[int, int]]]:
    """What the training strategy refuses ((N, B) -> why: never chosen, since `train`
    takes the choice) and where it trains plain SGD steps (its measured cost per step
    not added); neither without a training strategy."""
    if request.training_strategy is None:
        return {}, set()
    pairs = [(c.num_workers, c.global_batch) for c in space.candidates()]
    return (refusals(request.training_strategy, request.training_options, pairs),
            plain_steps(request.training_strategy, request.training_options, pairs))


def _plan_context(request: SearchRequest, space: SearchSpace, probe: MemoryProbe,
                  workers_per_node: int | None) -> PlanContext:
    """The plan's context, once the probe has bound the space: the user's objective,
    pricing, ..., the probe's memory model and bound, the training strategy's limits and
    the cluster's G; the adaptive search's rounds plan with it, and the final plan."""
    untrainable, plain = _training_limits(request, space)
    return PlanContext(
        epochs=request.epochs, dataset_size=request.workload.dataset_size,
        objective=request.objective, pricing=request.pricing, weight_time=request.weight_time,
        collective=request.collective, memory=probe.params,
        max_local_batch=probe.max_local_batch, reference_batch=request.reference_batch,
        noise_scale=request.noise_scale, workers_per_node=workers_per_node,
        untrainable=untrainable, plain_steps=plain, workload=request.workload.name,
        eval_at_local_batch=request.workload.eval_batch is None)


def _strategy_options(request: SearchRequest, context: PlanContext) -> dict[str, Any]:
    """The user's strategy options, plus the cluster's topology for a strategy that takes
    it (partial and adaptive) and the plan's context for one that plans as it goes
    (adaptive): all JSON, so the searcher's state stays JSON."""
    options = topology_options(request.search_strategy, request.strategy_options,
                               context.workers_per_node)
    return with_plan_context(request.search_strategy, options, context)


def _profile_settings(request: SearchRequest, bounds: SearchBounds, workers: Workers
                      ) -> ProfileSettings:
    """What every trial shares: it goes in the param space (`trial_param_space`), which
    Tune merges into each suggested config (as for Ray's own searchers), so the
    searcher's state stays JSON."""
    return ProfileSettings(
        workload=request.spec, workload_options=request.options, epochs=request.epochs,
        training_strategy=None if request.training_strategy is None
        else portable_training_strategy(request.training_strategy),
        training_options=request.training_options, warmup_steps=request.warmup_steps,
        measure_steps=request.measure_steps, measure_seconds=request.measure_seconds,
        device_memory_bytes=bounds.device_memory_bytes, use_gpu=workers.use_gpu,
        resources_per_worker=workers.resources,
        # N <= G workers are placed on one node, as `train` places them (topology)
        workers_per_node=workers.workers_per_node,
        provision_timeout_s=request.provision_timeout_s,
        # the profiled checkpoint is uploaded there, as `train`'s are to its storage
        storage_path=storage_root(request.storage_path))


def _profile(request: SearchRequest, bounds: SearchBounds, plan_context: PlanContext,
             param_space: dict[str, Any], name: str, resume: bool, record: dict[str, Any],
             verbose: int) -> tuple[TulaSearcher, str]:
    """DESIGN step 3: one Tune trial per cluster size and round, one at a time (concurrent
    trials would share the CPUs or the network and distort each other's step times);
    param_space: what every trial shares (`trial_param_space`)."""
    # Above the memory probe's checked bound a candidate is infeasible: the plan says so,
    # and no worker group is launched to learn it again.
    grid = [c for c in bounds.space.candidates()
            if c.local_batch <= bounds.probe.max_local_batch]
    searcher = TulaSearcher(grid, request.search_strategy,
                            _strategy_options(request, plan_context),
                            resume_record=record)
    return run_experiment(searcher, param_space, request.storage_path, name, resume, verbose)
