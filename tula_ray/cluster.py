"""Cluster concerns, in one place: starting or joining Ray, capacity, worker resources.

Ray-facing (imports ray); the search entry (`tula_ray.search`), the training entry
(`tula_ray.train`) and the trainables take these from here, never from each other.

Joining: `ensure_ray(address)` joins the Ray cluster the user names (an address, "auto"
for the cluster this machine belongs to, or the RAY_ADDRESS environment variable, which
`ray job submit` sets for a submitted driver). Nothing named: a new local Ray that keeps
everything on loopback (`start_local_ray`), so a search on a laptop exposes nothing to
the network.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

import ray

logger = logging.getLogger(__name__)

# The local default binds every Ray server to this address. Ray's core servers (GCS,
# raylet, workers) listen on ALL interfaces unless their node address is exactly
# 127.0.0.1, and Ray rewrites 127.0.0.1 to the external address unless its local-only
# switch is on (measured with Ray 2.60: see `start_local_ray`).
LOCAL_NODE_IP = "127.0.0.1"
ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable; `ray job submit` sets it for the driver
LOCAL_ADDRESS = "local"  # ray.init's word for "a new local Ray"
# Ray's switch for a Ray that stays on one machine (read by ray_constants at import,
# and by every Ray process it starts): node address 127.0.0.1, not rewritten.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Custom resource a Tune trial's driver holds instead of a CPU; `ray.init(resources=
# {DRIVER_RESOURCE: k})` allows k concurrent trials. Cluster nodes declare it in cluster.yaml.
DRIVER_RESOURCE = "train_driver"
DRIVER_SLOTS_DEFAULT = 4  # trial drivers a local Ray offers (trials run one at a time anyway)
CPU_MEMORY_SHARE_DEFAULT = 0.25  # of the node's RAM per worker, when the user declares none


def node_memory_bytes() -> int:
    """RAM of this machine, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_address(address: str | None) -> None:
    """Refuse an `address` that is not a Ray address (before Ray starts)."""
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise ValueError(
            f"address={address!r}; it must be a Ray cluster address (e.g. '10.0.0.1:6379' or "
            f"'ray://host:10001'), 'auto' (the cluster this machine belongs to), "
            f"'{LOCAL_ADDRESS}' (a new local Ray) or None (${ADDRESS_ENV}, else a local Ray)")


def ensure_ray(address: str | None = None) -> bool:
    """Join the Ray cluster the user names, else start a local Ray on loopback.

    In order: a Ray this process already initialised (the user's own `ray.init(...)`) is
    used as it is; `address` (a cluster address, or "auto" for the cluster this machine
    belongs to, e.g. on the head of `ray up`); the RAY_ADDRESS environment variable
    (set by `ray job submit` for a submitted driver); else, or with address="local",
    a new local Ray (`start_local_ray`). Returns True when this call connected or
    started Ray, so the caller should `ray.shutdown()` it (which leaves a joined
    cluster running).
    """
    check_address(address)
    if ray.is_initialized():
        if address not in (None, LOCAL_ADDRESS):
            logger.info("Ray is already initialised in this process; using it, not %r", address)
        return False
    target = address or os.environ.get(ADDRESS_ENV) or LOCAL_ADDRESS
    if target == LOCAL_ADDRESS:
        start_local_ray()
    else:
        # An explicit address wins over RAY_ADDRESS; "auto" defers to it (ray.init's rules).
        ray.init(address=target, log_to_driver=False)
        logger.info("joined the Ray cluster at %s (%d nodes)", target,
                    sum(1 for node in ray.nodes() if node["Alive"]))
    return True


def start_local_ray(num_cpus: int | None = None) -> None:
    """A new single-node Ray on this machine whose servers listen on loopback only.

    Ray's core servers bind every interface unless the node address is 127.0.0.1, and
    Ray rewrites 127.0.0.1 to the external address unless its local-only switch
    (`LOCAL_ONLY_ENV`, read once at import) is off. So the switch is turned off for
    the `ray.init` call: in the environment the Ray processes inherit, and in the
    already-imported constant of this process; both are restored afterwards (the
    processes have started by then), so a later `ray start` or join is unaffected.
    Token authentication is left as Ray sets it.
    """
    from ray._private import ray_constants  # the constant Ray read at import

    saved_env, saved_flag = os.environ.get(LOCAL_ONLY_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(
            # "local": always a new local Ray; a bare ray.init() would join any Ray
            # cluster already running on this machine (someone else's, or a test's).
            address=LOCAL_ADDRESS,
            num_cpus=num_cpus,
            _node_ip_address=LOCAL_NODE_IP,
            # Trials hold this instead of a CPU, so N workers can use all N CPUs.
            resources={DRIVER_RESOURCE: DRIVER_SLOTS_DEFAULT},
            include_dashboard=True,
            dashboard_host=LOCAL_NODE_IP,
            log_to_driver=False,
        )
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = saved_env


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[None]:
    """`ensure_ray(address)` for a block (one Ray for several searches or trainings);
    disconnected on exit only if this block connected it."""
    started = ensure_ray(address)
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
