"""`tula_ray.search()`: memory probe -> bounded space -> Tune trials -> Plan (DESIGN "Data flow").

The search entry point (Ray-facing); the models it feeds live in the core modules,
cluster concerns in `tula_ray.cluster`. It never imports the training entry point.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

import pandas as pd
import ray
from ray import tune

from searchers import TulaSearcher
from trainables.memory_probe import check_max_local_batch, probe_memory
from trainables.profiling_loop import MEASURE_STEPS_DEFAULT, WARMUP_STEPS_DEFAULT
from trainables.profiling_trial import trainable_with_resources
from tula_ray import memory as memory_model
from tula_ray.cluster import (CPU_MEMORY_SHARE_DEFAULT, PROVISION_TIMEOUT_S_DEFAULT,
                              check_storage_path, check_worker_request, ensure_ray,
                              node_memory_bytes, provision_workers, release_workers)
from tula_ray.perf import COLLECTIVES, MODES
from tula_ray.plan import Plan, build_plan
from tula_ray.policy import OBJECTIVES
from tula_ray.pricing import Pricing, parse_pricing
from tula_ray.profile_table import profile_frame, profile_row
from tula_ray.space import MIN_BATCH_DEFAULT, SearchSpace, check_positive_ints
from tula_ray.workloads import Workload, resolve_workload

logger = logging.getLogger(__name__)

def _validate(r: "_Request") -> None:
    check_positive_ints("cluster_sizes", r.cluster_sizes)
    if r.objective not in OBJECTIVES:
        raise ValueError(f"objective {r.objective!r} is unknown; use one of {OBJECTIVES}")
    if r.mode not in MODES:
        raise ValueError(f"mode {r.mode!r} is unknown; use one of {MODES}")
    if r.collective not in COLLECTIVES:
        raise ValueError(f"collective {r.collective!r} is unknown; known: {sorted(COLLECTIVES)}")
    if not 0.0 <= r.weight_time <= 1.0:
        raise ValueError(f"weight_time={r.weight_time!r}; it must be within [0, 1]")
    if not 0.0 <= r.headroom < 1.0:
        raise ValueError(f"headroom={r.headroom!r}; it must be within [0, 1)")
    for label, value, low in (("min_batch", r.min_batch, 1), ("warmup_steps", r.warmup_steps, 0),
                              ("measure_steps", r.measure_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{label}={value!r}; it must be an integer >= {low}")
    if r.max_batch is not None and r.max_batch < r.min_batch:
        raise ValueError(f"max_batch={r.max_batch} is below min_batch={r.min_batch}; "
                         "max_batch must be >= min_batch")
    if r.device_memory_gb is not None and not r.device_memory_gb > 0:
        raise ValueError(f"device_memory_gb={r.device_memory_gb!r}; it must be positive")
    if r.min_batch > r.workload.dataset_size:
        raise ValueError(f"min_batch={r.min_batch} is larger than the dataset "
                         f"({r.workload.dataset_size} samples)")


@dataclass(frozen=True)
class _Request:
    """The user's arguments to `search`, validated, as one value."""

    spec: str | Workload  # what workers rebuild the workload from (a name, or the object)
    options: dict[str, Any]
    workload: Workload
    cluster_sizes: tuple[int, ...]
    min_batch: int
    max_batch: int | None
    objective: str
    mode: str
    pricing: Pricing
    weight_time: float
    device_memory_gb: float | None
    headroom: float
    collective: str
    warmup_steps: int
    measure_steps: int
    storage_path: str | None
    name: str | None


def search(
    workload: str | Workload = "fashion-mnist-cnn",
    *,
    cluster_sizes: Sequence[int] = (1, 2),
    min_batch: int = MIN_BATCH_DEFAULT,
    max_batch: int | None = None,
    objective: str = "knee",
    mode: str = "partial",
    pricing: Pricing | str | dict = "fixed",
    weight_time: float = 0.5,
    device_memory_gb: float | None = None,
    headroom: float = memory_model.HEADROOM_DEFAULT,
    collective: str = "ring",
    warmup_steps: int = WARMUP_STEPS_DEFAULT,
    measure_steps: int = MEASURE_STEPS_DEFAULT,
    storage_path: str | None = None,
    name: str | None = None,
    workload_options: dict[str, Any] | None = None,
    address: str | None = None,
    resources_per_worker: dict[str, float] | None = None,
    provision_timeout_s: float = PROVISION_TIMEOUT_S_DEFAULT,
) -> Plan:
    """Profile candidates on Ray, fit the models, and return the Plan with the choice.

    workload: a built-in name (see tula_ray.workloads.WORKLOADS) or a Workload;
      workload_options go to the built-in (data, train_subset, epochs, ...).
    cluster_sizes: the N to consider; each must fit the cluster's GPUs (or CPUs).
    min_batch, max_batch: global batch bounds; the memory probe lowers max_batch
      to what one device holds (times the largest N), and the dataset size caps it.
    mode: "partial" profiles only the extremes; "full" every candidate.
    objective, weight_time, pricing: see tula_ray.policy.choose and tula_ray.pricing.
    device_memory_gb: memory of one device; GPUs report theirs, on CPU this is the
      share of RAM a worker may use (default 25 % of the node's RAM).
    storage_path, name: where Ray Tune keeps the experiment (default ~/ray_results).
    address: the Ray cluster to join ("auto": the one this machine belongs to); default
      $RAY_ADDRESS, else a new local Ray on loopback (see tula_ray.cluster.ensure_ray).
      A Ray this process already initialised is used as it is.
    resources_per_worker: one worker's resources as in Ray's ScalingConfig, e.g.
      {"CPU": 4}; default one device per worker (a GPU when the cluster has or can add
      GPUs, else a CPU), so N counts devices.
    provision_timeout_s: how long to wait for an autoscaler to add the nodes the largest
      cluster size needs (see tula_ray.cluster.provision_workers).
    On a multi-node cluster storage_path must be reachable from every node (a shared
    file system or a cloud URI); the search refuses otherwise, before any trial.
    """
    options = dict(workload_options or {})
    request = _Request(
        workload, options, resolve_workload(workload, options), tuple(sorted(set(cluster_sizes))),
        min_batch, max_batch, objective, mode, parse_pricing(pricing), weight_time,
        device_memory_gb, headroom, collective, warmup_steps, measure_steps, storage_path, name)
    _validate(request)
    resources = check_worker_request(resources_per_worker, provision_timeout_s)
    started_ray = ensure_ray(address)
    workers = None
    try:
        workers = provision_workers(request.cluster_sizes[-1], resources,
                                    timeout_s=provision_timeout_s)
        check_storage_path(request.storage_path)
        use_gpu = workers.use_gpu
        started = time.perf_counter()
        space, probe, device_bytes = _bounded_space(request, use_gpu)
        probe_s = time.perf_counter() - started
        profiles, experiment = _profile(request, space, use_gpu, device_bytes, workers.resources)
        meta = {"probe_wall_s": probe_s,
                "profiling_wall_s": time.perf_counter() - started - probe_s,
                "trials": len(profiles), "device_memory_bytes": device_bytes,
                "max_local_batch": probe["max_local_batch"], "use_gpu": use_gpu,
                "ray_version": ray.__version__, "experiment": experiment,
                "memory_probe": probe["rows"],
                "workload_options": _json_options(request.options)}
        workload = request.workload
        return build_plan(
            space, profiles, epochs=workload.epochs, dataset_size=workload.dataset_size,
            mode=request.mode, objective=request.objective, pricing=request.pricing,
            memory=probe["params"], max_local_batch=probe["max_local_batch"],
            weight_time=request.weight_time, collective=request.collective,
            workload=workload.name, meta=meta)
    finally:
        release_workers(workers)
        if started_ray:
            ray.shutdown()


def _json_options(options: dict[str, Any]) -> dict[str, Any]:
    """The workload options a plan can record, so `tula_ray.train(plan)` rebuilds the same
    workload (e.g. the same train_subset); functions (loss_fn, ...) cannot go into JSON."""
    kept = {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool, type(None)))}
    if len(kept) < len(options):
        logger.warning("the plan does not record workload options %s (not JSON); pass them "
                       "again to tula_ray.train(..., workload_options=...)",
                       sorted(set(options) - set(kept)))
    return kept


def _bounded_space(request: _Request, use_gpu: bool) -> tuple[SearchSpace, dict, float]:
    """DESIGN step 1-2: the memory probe on one worker bounds B; the space up to it."""
    sizes = request.cluster_sizes
    probe = probe_memory(request.spec, request.options,
                         min_local_batch=max(1, request.min_batch // sizes[-1]), use_gpu=use_gpu)
    if request.device_memory_gb is not None:
        device_bytes = request.device_memory_gb * 1e9
    else:
        device_bytes = (probe["device_memory_bytes"]
                        or CPU_MEMORY_SHARE_DEFAULT * node_memory_bytes())
    # No candidate needs a local batch above max_batch / N_min: nothing larger is measured.
    largest = min(request.max_batch or request.workload.dataset_size, request.workload.dataset_size)
    cap = max(1, largest // sizes[0])
    probe = check_max_local_batch(request.spec, request.options, probe, device_bytes,
                                  headroom=request.headroom, cap=cap, use_gpu=use_gpu)
    max_local = probe["max_local_batch"]
    bound = min(max_local * sizes[-1], largest)
    if bound < request.min_batch:
        raise ValueError(
            f"min_batch={request.min_batch} does not fit: the memory model allows at most a "
            f"local batch of {max_local} ({device_bytes / 1e9:.3g} GB device memory, headroom "
            f"{request.headroom:.0%}), so B <= {bound}; lower min_batch or declare more memory")
    space = SearchSpace.build(sizes, min_batch=request.min_batch, max_batch=bound)
    return space, probe, device_bytes


def _profile(request: _Request, space: SearchSpace, use_gpu: bool, device_bytes: float,
             resources: dict[str, float]) -> tuple[pd.DataFrame, str]:
    """DESIGN step 3: one Tune trial per candidate, one at a time (concurrent trials
    would share the CPUs or the network and distort each other's step times)."""
    fixed = {"workload": request.spec, "workload_options": request.options, "use_gpu": use_gpu,
             "warmup_steps": request.warmup_steps, "measure_steps": request.measure_steps,
             "device_memory_bytes": device_bytes, "resources_per_worker": resources}
    searcher = TulaSearcher(space.candidates(), request.mode, fixed)
    name = request.name or f"tula-{request.workload.name}-{datetime.now():%Y%m%d-%H%M%S}"
    tuner = tune.Tuner(
        trainable_with_resources(),
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, max_concurrent_trials=1,
                                    metric="step_time_s", mode="min"),
        run_config=tune.RunConfig(storage_path=request.storage_path, name=name, verbose=1),
    )
    return profile_frame(_rows(tuner.fit())), name


def _rows(results: tune.ResultGrid) -> list[dict[str, Any]]:
    """One profile row per trial; a trial that raised is a row with status 'error'."""
    return [profile_row(result.config["num_workers"], result.config["global_batch"],
                        result.metrics, None if result.error is None else str(result.error))
            for result in results]
