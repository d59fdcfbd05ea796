"""Cluster concerns, in one place: starting or joining Ray, capacity, worker resources.

Ray-facing (imports ray); the search entry (`tula_ray.search`), the training entry
(`tula_ray.train`) and the trainables take these from here, never from each other.

The local default keeps everything on loopback: Ray and its dashboard listen on
`LOCAL_NODE_IP`, an address Ray does not rewrite to the machine's external one
(NOTES-ENV), so running a search on a laptop exposes nothing to the network.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

import ray

logger = logging.getLogger(__name__)

LOCAL_NODE_IP = "127.0.0.2"  # loopback that Ray does not rewrite (NOTES-ENV): nothing exposed
# Custom resource a Tune trial's driver holds instead of a CPU; `ray.init(resources=
# {DRIVER_RESOURCE: k})` allows k concurrent trials. Cluster nodes declare it in cluster.yaml.
DRIVER_RESOURCE = "train_driver"
DRIVER_SLOTS_DEFAULT = 4  # trial drivers a local Ray offers (trials run one at a time anyway)
CPU_MEMORY_SHARE_DEFAULT = 0.25  # of the node's RAM per worker, when the user declares none


def node_memory_bytes() -> int:
    """RAM of this machine, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def ensure_ray() -> bool:
    """Start a local Ray on loopback unless the user already called `ray.init(...)`.

    Returns True when this call started Ray (and so should shut it down).
    """
    if ray.is_initialized():
        return False
    ray.init(
        # "local": always a new local Ray; a bare ray.init() would join any Ray
        # cluster already running on this machine (someone else's, or a test's).
        address="local",
        _node_ip_address=LOCAL_NODE_IP,
        # Trials hold this instead of a CPU, so N workers can use all N CPUs.
        resources={DRIVER_RESOURCE: DRIVER_SLOTS_DEFAULT},
        include_dashboard=True,
        dashboard_host=LOCAL_NODE_IP,
        log_to_driver=False,
    )
    return True


@contextlib.contextmanager
def ray_session() -> Iterator[None]:
    """`ensure_ray()` for a block (one Ray for several searches or trainings); shut down on
    exit only if this block started it."""
    started = ensure_ray()
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def use_gpu_default() -> bool:
    """Whether the cluster has GPUs: then every worker takes one."""
    return bool(ray.cluster_resources().get("GPU", 0))


def check_capacity(cluster_sizes: tuple[int, ...], use_gpu: bool) -> None:
    """Refuse a cluster size larger than the cluster's devices (GPUs, or CPUs without GPUs)."""
    kind = "GPU" if use_gpu else "CPU"
    capacity = int(ray.cluster_resources().get(kind, 0))
    if cluster_sizes[-1] > capacity:
        raise ValueError(f"cluster size {cluster_sizes[-1]} is larger than the cluster's "
                         f"{capacity} {kind}s; allowed cluster sizes are <= {capacity}")


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


def worker_resources(num_workers: int, use_gpu: bool,
                     cpus_per_worker: float | None = None) -> dict[str, float]:
    """Resources of one Train worker.

    GPU: one GPU (ScalingConfig's default) and one CPU. CPU: the node's CPUs
    shared out, at most one each: min(1, CPUs / N), so N = 4 workers run on 2
    CPUs at 0.5 each (oversubscribed, measured to work).
    """
    if cpus_per_worker is None:
        cpus_per_worker = 1.0 if use_gpu else min(
            1.0, ray.cluster_resources().get("CPU", 1.0) / num_workers)
    if cpus_per_worker <= 0:
        raise ValueError(f"cpus_per_worker={cpus_per_worker!r}; it must be > 0")
    resources = {"CPU": float(cpus_per_worker)}
    if use_gpu:
        resources["GPU"] = 1.0
    return resources
