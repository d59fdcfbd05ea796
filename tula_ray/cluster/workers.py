"""Workers and capacity: what one worker holds, provisioning N of them, and what a trial's
driver holds (Ray-facing).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import yaml

from tula_ray.arguments import check_mapping, check_number
from tula_ray.cluster.session import DRIVER_RESOURCE, started_ray_here

logger = logging.getLogger(__name__)


def task_options(resources: dict[str, float]) -> dict[str, Any]:
    """`ray.remote` options for a task that holds one worker's `resources` (as Ray's
    ScalingConfig writes them: "CPU", "GPU", custom names)."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0),
            **({"resources": custom} if custom else {})}


def use_gpu_default() -> bool:
    """Whether the cluster has GPUs: then every worker takes one."""
    return bool(ray.cluster_resources().get("GPU", 0))


# ------------------------------------------------------------------ workers and capacity

# Node launch plus setup (cluster.yaml pip-installs torch on each node) takes minutes on a
# cloud: long enough for that, bounded so a launch that never succeeds ends in an error.
PROVISION_TIMEOUT_S_DEFAULT = 1800.0
# Ray Train retries a worker group that fails to start (each try waits
# RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s by default) forever unless told otherwise
# (FailureConfig.controller_failure_limit): a trial whose workers never get their devices
# would hold the whole search or tuning. The workers were provisioned before the first
# trial, so a few retries cover a worker lost while its group starts; more is a fault.
WORKER_GROUP_START_RETRIES = 10
PROVISION_POLL_S = 5.0
# Where the cluster launcher (`ray up`) puts the autoscaler's config on the head (Ray Tune
# looks there too, to tell an autoscaling cluster); TULA_RAY_AUTOSCALING_CONFIG overrides.
AUTOSCALING_CONFIG_PATH = "~/ray_bootstrap_config.yaml"
AUTOSCALING_CONFIG_ENV = "TULA_RAY_AUTOSCALING_CONFIG"
GPU_WORKER = {"CPU": 1.0, "GPU": 1.0}  # one device per worker: a GPU (and a CPU to feed it)
CPU_WORKER = {"CPU": 1.0}  # one device per worker: a core
RESOURCE_PRECISION = 1e-4  # Ray's smallest fractional resource quantity
CPU_MEMORY_SHARE_DEFAULT = 0.25  # of the node's RAM per worker, when the user declares none


def node_memory_bytes() -> int:
    """RAM of this machine, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_resources_per_worker(resources: Any) -> dict[str, float] | None:
    """Resources of one worker as Ray's `ScalingConfig(resources_per_worker=...)` takes
    them: a dict of resource name -> positive number. None: one device per worker."""
    if resources is None:
        return None
    allowed = ("a dict of resource name -> positive number, e.g. {'CPU': 4} or "
               "{'CPU': 8, 'GPU': 1} (None: one GPU, or one CPU, per worker)")
    check_mapping("resources_per_worker", resources, hint=allowed)
    if not resources:
        raise ValueError(f"resources_per_worker={resources!r}; it must be {allowed}")
    checked = {}
    for name, amount in resources.items():
        if not name:
            raise ValueError(f"resources_per_worker has the key {name!r}; it must be {allowed}")
        check_number(f"resources_per_worker[{name!r}]", amount, low=RESOURCE_PRECISION,
                     hint="Ray's resolution")
        if name == "GPU" and amount > 1 and amount != int(amount):
            raise ValueError(f"resources_per_worker['GPU']={amount!r}; more than one GPU per "
                             "worker must be a whole number (fractions only below 1)")
        checked[name] = float(amount)
    return checked


def check_worker_request(resources_per_worker: Any, provision_timeout_s: Any,
                         use_gpu: bool | None = None) -> dict[str, float] | None:
    """Check the worker arguments of `search`/`train` before Ray starts; returns the
    checked `resources_per_worker`."""
    resources = check_resources_per_worker(resources_per_worker)
    check_number("provision_timeout_s", provision_timeout_s, low=0.0, high=math.inf,
                 hint="seconds to wait for the autoscaler's nodes")
    if use_gpu is not None and resources is not None and use_gpu != (resources.get("GPU", 0) > 0):
        raise ValueError(f"use_gpu={use_gpu!r} contradicts resources_per_worker={resources!r}; "
                         "give GPU in resources_per_worker exactly when use_gpu is True (or "
                         "leave use_gpu None)")
    return resources


def workers_that_fit(worker: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """How many workers of this shape the nodes hold together (each worker on one node)."""
    return sum(min(int(node.get(name, 0.0) / amount + 1e-9) for name, amount in worker.items())
               for node in nodes)


def autoscaler_node_types(path: str | None = None) -> list[tuple[dict[str, float], int]] | None:
    """(resources, max count) of every node type the autoscaler may launch, read from its
    config (the head's `AUTOSCALING_CONFIG_PATH`); None when this is no autoscaling cluster."""
    path = path or os.environ.get(AUTOSCALING_CONFIG_ENV) or AUTOSCALING_CONFIG_PATH
    config_file = Path(path).expanduser()
    if not config_file.is_file():
        return None
    config = yaml.safe_load(config_file.read_text()) or {}
    total_max = int(config.get("max_workers", 0))
    types = [({k: float(v) for k, v in (spec.get("resources") or {}).items()},
              min(int(spec.get("max_workers", total_max)), total_max))
             for spec in (config.get("available_node_types") or {}).values()]
    # A head type has max_workers 0 in a cloud config; on-prem (`local` provider) the head
    # and the workers share one type.
    return [(resources, count) for resources, count in types if count > 0]


def joined_node_types() -> list[tuple[dict[str, float], int]] | None:
    """`autoscaler_node_types()` of the cluster this process joined; None for a Ray it
    started itself: a new local Ray on a cluster head would otherwise take the head's
    autoscaler config as its own and wait for nodes that only join the head's Ray."""
    if started_ray_here():
        return None
    return autoscaler_node_types()


def worker_shape(resources_per_worker: dict[str, float] | None = None, *,
                 use_gpu: bool | None = None) -> dict[str, float]:
    """One worker's resources: the one answer for the search, training, tuning and the
    trainables alike.

    `resources_per_worker` (checked by `check_resources_per_worker`) when given; else one
    device per worker: a GPU and a CPU to feed it when `use_gpu`, a CPU when not; with
    `use_gpu` None, a GPU when the cluster has GPUs or its autoscaler can add GPU nodes
    (those start at zero: cluster.yaml has min_workers 0).
    """
    if resources_per_worker is not None:
        return dict(resources_per_worker)
    if use_gpu is None:
        can_add_gpus = any(resources.get("GPU", 0) > 0 and count > 0
                           for resources, count in joined_node_types() or [])
        use_gpu = ray.cluster_resources().get("GPU", 0.0) > 0 or can_add_gpus
    return dict(GPU_WORKER if use_gpu else CPU_WORKER)


@dataclass(frozen=True)
class Workers:
    """What `provision_workers` settled: one worker's resources, and whether they are GPUs."""

    resources: dict[str, float]
    use_gpu: bool
    requested: bool  # an autoscaler request is outstanding (`release_workers` clears it)


def provision_workers(num_workers: int, resources_per_worker: dict[str, float] | None = None,
                      *, use_gpu: bool | None = None,
                      timeout_s: float = PROVISION_TIMEOUT_S_DEFAULT) -> Workers:
    """Make sure the cluster holds `num_workers` workers, asking its autoscaler for them.

    The worker's shape: `worker_shape(resources_per_worker, use_gpu=use_gpu)`. When the
    running nodes hold fewer such workers and this is an
    autoscaling cluster, the workers are requested from the autoscaler
    (`ray.autoscaler.sdk.request_resources`) and waited for, at most `timeout_s`: an
    autoscaler adds nodes only on demand, and the GPU nodes of cluster.yaml start at
    zero. Raises ValueError when the cluster can never hold them, TimeoutError when the
    autoscaler did not deliver in time; each names what is missing and what to do.
    """
    node_types = joined_node_types()
    worker = worker_shape(resources_per_worker, use_gpu=use_gpu)
    fits_now = workers_that_fit(worker, alive_node_resources())
    if fits_now >= num_workers:
        return Workers(worker, worker.get("GPU", 0) > 0, requested=False)
    shape = f"{num_workers} workers of {worker}"
    if node_types is None:
        held = (f"the cluster's {fits_now} {'GPU' if worker.get('GPU') else 'CPU'}s"
                if worker in (GPU_WORKER, CPU_WORKER) else
                f"the {fits_now} workers of {worker} the cluster holds")
        raise ValueError(f"cluster size {num_workers} is larger than {held}; allowed cluster "
                         f"sizes are <= {fits_now} (or ask less per worker with "
                         "resources_per_worker, or add nodes)")
    # An on-prem (`local` provider) config declares no resources: Ray detects them at
    # start, so the most the autoscaler can add is unknown until its nodes are up.
    known = all(resources for resources, _ in node_types)
    possible = fits_now + sum(workers_that_fit(worker, [resources]) * count
                              for resources, count in node_types)
    if known and possible < num_workers:
        raise ValueError(
            f"this autoscaling cluster can hold at most {possible} workers of {worker} "
            f"(running nodes plus max_workers of each node type in its config), fewer than "
            f"{num_workers}: use cluster sizes <= {possible}, or raise max_workers in the "
            "cluster config (cluster.yaml)")
    from ray.autoscaler.sdk import request_resources

    logger.info("asking the autoscaler for %s (the running nodes hold %d)", shape, fits_now)
    request_resources(bundles=[worker] * num_workers)
    deadline = time.monotonic() + timeout_s
    while True:
        fits_now = workers_that_fit(worker, alive_node_resources())
        if fits_now >= num_workers:
            logger.info("the cluster now holds %s", shape)
            return Workers(worker, worker.get("GPU", 0) > 0, requested=True)
        if time.monotonic() >= deadline:
            release_workers(Workers(worker, False, requested=True))
            raise TimeoutError(
                f"waited {timeout_s:.0f} s for the autoscaler to add nodes for {shape}; the "
                f"cluster holds {fits_now} (resources now: {_rounded(ray.cluster_resources())})."
                " See `ray status` and the autoscaler's log on the head "
                "(/tmp/ray/session_latest/logs/monitor.*) for failed launches (quota, "
                "instance type, setup commands); or raise provision_timeout_s, or start the "
                "nodes beforehand (min_workers in the cluster config)")
        time.sleep(PROVISION_POLL_S)


def release_workers(workers: Workers | None) -> None:
    """Withdraw the autoscaler request of `provision_workers`, so idle nodes can go."""
    if workers is not None and workers.requested and ray.is_initialized():
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[])


def alive_node_resources() -> list[dict[str, float]]:
    """Total resources of each node that is alive now."""
    return [node["Resources"] for node in ray.nodes() if node["Alive"]]


def _rounded(resources: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in resources.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}


def trial_resources() -> dict[str, float]:
    """Resources of one profiling trial's driver: no CPU, one `DRIVER_RESOURCE`.

    A trial holding a CPU leaves N = 2 workers on a 2-CPU node waiting forever
    (NOTES-ENV), and Tune refuses a bare {"CPU": 0}. When Ray is running without
    that resource (someone else's `ray.init`), the trial takes one CPU instead,
    so it is scheduled rather than pending forever.
    """
    if ray.is_initialized() and not ray.cluster_resources().get(DRIVER_RESOURCE):
        logger.warning("the Ray cluster has no %r resource; profiling trials take 1 CPU each "
                       "(start Ray with resources={%r: 4} to keep every CPU for workers)",
                       DRIVER_RESOURCE, DRIVER_RESOURCE)
        return {"CPU": 1}
    return {"CPU": 0, DRIVER_RESOURCE: 1}
