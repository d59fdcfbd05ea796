"""Workers and capacity: what one worker holds, provisioning N of them, and what a trial's
driver holds (Ray-facing).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
import yaml

from tula_ray.arguments import check_mapping, check_number
from tula_ray.cluster.placement import (bundles_fit, holds_placed, most_on_one_node,
                                        workers_that_fit)
from tula_ray.cluster.requests import driver_keeper, hold_request
from tula_ray.cluster.session import DRIVER_RESOURCE, started_ray_here
from tula_ray.models.topology import STRICT_PACK, node_bundles, placement_strategy

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
# Ray Train's controller learns that the workers' function ended (and takes their reports)
# by polling them every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default: each launch then
# waits at its end, and at every report that comes sooner than the last poll (a worker
# holds one report at a time). A poll is one small actor call per worker, and
# a slow answer is only counted as missed (a worker is declared dead after 10 minutes of
# them), so polling every quarter second costs the workers nothing measurable
# (`python -m benchmarks launch-overhead`). A value the user set is kept.
TRAIN_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
TRAIN_POLL_S = 0.25
# Ray Train's preemption watcher (one actor, so one more process, per worker group) lets a
# run wait out a node drain and then restart it. A launch that never restarts (a profiling
# or tuning launch: max_failures=0) gives it nothing to do, and Ray core logs an error line
# each time it starts one ("constructor arguments in the object store and max_restarts >
# 0"). `train` restarts, so it keeps the watcher.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
# Where the cluster launcher (`ray up`) puts the autoscaler's config on the head (Ray Tune
# looks there too, to tell an autoscaling cluster); TULA_RAY_AUTOSCALING_CONFIG overrides.
AUTOSCALING_CONFIG_PATH = "~/ray_bootstrap_config.yaml"
AUTOSCALING_CONFIG_ENV = "TULA_RAY_AUTOSCALING_CONFIG"
# One device per worker: a GPU, and a CPU to feed it when no GPU node's shape is known;
# else its share of its node's CPUs (`gpu_worker`).
GPU_WORKER = {"CPU": 1.0, "GPU": 1.0}
CPU_WORKER = {"CPU": 1.0}  # one device per worker: a core
RESOURCE_PRECISION = 1e-4  # Ray's smallest fractional resource quantity
CPU_MEMORY_SHARE_DEFAULT = 0.25  # of the node's RAM per worker, when the user declares none


def prompt_train_polls() -> None:
    """Before a TorchTrainer's `fit()`: its controller polls the workers every TRAIN_POLL_S
    unless the environment says otherwise (Ray passes the variable on from the process
    calling `fit()` to the controller and its workers)."""
    os.environ.setdefault(TRAIN_POLL_ENV, str(TRAIN_POLL_S))


def without_preemption_watcher() -> None:
    """Before the `fit()` of a launch that never restarts: no preemption watcher (Ray Train
    reads the variable from the process calling `fit()`); a value the user set is kept."""
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")


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
    device per worker: a GPU and its share of its node's CPUs when `use_gpu`
    (`gpu_worker`), a CPU when not; with `use_gpu` None, a GPU when the cluster has GPUs
    or its autoscaler can add GPU nodes (those start at zero: cluster.yaml has
    min_workers 0).
    """
    if resources_per_worker is not None:
        return dict(resources_per_worker)
    if use_gpu is False:
        return dict(CPU_WORKER)
    node_types = [resources for resources, count in joined_node_types() or [] if count > 0]
    if use_gpu is None:
        can_add_gpus = any(resources.get("GPU", 0) > 0 for resources in node_types)
        use_gpu = ray.cluster_resources().get("GPU", 0.0) > 0 or can_add_gpus
    if not use_gpu:
        return dict(CPU_WORKER)
    alive = alive_node_resources() if ray.is_initialized() else []
    return gpu_worker([*alive, *node_types])


def gpu_worker(nodes: list[dict[str, float]]) -> dict[str, float]:
    """A GPU worker's resources: one GPU and its node's CPUs divided by its GPUs (at least
    one; the fewest over the GPU node shapes in `nodes`, so that it fits on each), so
    that torch's threads and the DataLoader's processes (`loader_workers`, from the
    threads Ray gives the worker) feed the GPU; one CPU when no GPU node is known. With
    one CPU, torch runs one thread and a user's Dataset is decoded in the training
    process: the GPU starves (issue 45, item 5)."""
    shares = [math.floor(node.get("CPU", 0.0) / node["GPU"]) for node in nodes
              if node.get("GPU", 0.0) >= 1]
    return {"CPU": float(max(1, min(shares))) if shares else GPU_WORKER["CPU"], "GPU": 1.0}


@dataclass(frozen=True)
class Workers:
    """What `provision_workers` settled: one worker's resources, and whether they are GPUs."""

    resources: dict[str, float]
    use_gpu: bool
    requested: bool  # an autoscaler request is outstanding (`release_workers` clears it)
    # G: the most workers of this shape one node holds (`workers_per_node`); None: no node
    # holds one. Every run places a cluster size N by it (`scaling_config`).
    workers_per_node: int | None = None


# ------------------------------------------------------------------ placement (issue 26)

def workers_per_node(worker: dict[str, float], nodes: list[dict[str, float]] | None = None,
                     node_types: list[tuple[dict[str, float], int]] | None = None) -> int | None:
    """G, the most workers of this shape ONE node holds: over the alive `nodes` (default
    `alive_node_resources()`) and the node types an autoscaler may add (`node_types` as
    `joined_node_types()` gives them, its default; [] for none). None when no node holds
    one. N <= G share a node, a larger N crosses the network (`tula_ray.models.topology`);
    the search, `train` and `tune_training` all place N by it, so that what is profiled is
    what is trained."""
    nodes = alive_node_resources() if nodes is None else nodes
    node_types = (joined_node_types() or []) if node_types is None else node_types
    return most_on_one_node(worker, [*nodes, *(resources for resources, count in node_types
                                               if count > 0)])


def provision_workers(num_workers: int, resources_per_worker: dict[str, float] | None = None,
                      *, use_gpu: bool | None = None,
                      timeout_s: float = PROVISION_TIMEOUT_S_DEFAULT,
                      most_workers: int | None = None) -> Workers:
    """Make sure the cluster holds `num_workers` workers placed as a trial places them
    (`holds_placed`), asking its autoscaler for them; first check that it can ever hold
    `most_workers` (default `num_workers`), the most the run will ask for later.

    The worker's shape: `worker_shape(resources_per_worker, use_gpu=use_gpu)`; G, the most
    of them one node holds: `workers_per_node` (returned in `Workers`). On an autoscaling
    cluster the request for them (`ray.autoscaler.sdk.request_resources`, in the bundles
    that place them as the trial does: `topology.node_bundles`) is made, replacing the one
    before, so that nodes a larger N asked for may go once idle; it is held by the
    driver's `RequestKeeper`, which withdraws it should the driver die (`request_workers`).
    The workers are then waited for, at most `timeout_s`: an autoscaler adds nodes only on
    demand, and the GPU nodes of cluster.yaml start at zero. Raises ValueError when the
    cluster can never hold `most_workers`, TimeoutError when the autoscaler did not deliver
    in time; each names what is missing and what to do.
    """
    node_types = joined_node_types()
    worker = worker_shape(resources_per_worker, use_gpu=use_gpu)
    nodes = alive_node_resources()
    per_node = workers_per_node(worker, nodes, node_types or [])
    settled = Workers(worker, worker.get("GPU", 0) > 0, requested=False,
                      workers_per_node=per_node)
    most = max(num_workers, most_workers or 0)
    if node_types is None:
        _check_static_cluster_holds(worker, most, per_node, nodes)
        return settled
    _check_autoscaler_can_place(worker, most, per_node, node_bundles(worker, most, per_node),
                                nodes, node_types)
    request_workers(node_bundles(worker, num_workers, per_node))
    settled = replace(settled, requested=True)
    if holds_placed(worker, num_workers, per_node, nodes):
        return settled
    shape = _placed(worker, num_workers, per_node)
    logger.info("asked the autoscaler for %s (the running nodes hold %d)", shape,
                workers_that_fit(worker, nodes))
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = alive_node_resources()
        if holds_placed(worker, num_workers, per_node, nodes):
            logger.info("the cluster now holds %s", shape)
            return settled
        if time.monotonic() >= deadline:
            release_workers(settled)
            raise TimeoutError(_not_delivered(worker, shape, nodes, timeout_s))
        time.sleep(PROVISION_POLL_S)


def request_workers(bundles: list[dict[str, float]]) -> None:
    """Make `bundles` the cluster's autoscaler request, held by the driver's
    `RequestKeeper` (started here on first use; the driver's trials find it by name)."""
    hold_request(driver_keeper(), bundles)


def _check_static_cluster_holds(worker: dict[str, float], num_workers: int,
                                per_node: int | None, nodes: list[dict[str, float]]) -> None:
    """ValueError when a cluster without an autoscaler cannot place `num_workers`."""
    if holds_placed(worker, num_workers, per_node, nodes):
        return
    # G is then the most one running node holds: one node holds any N <= G, so what is
    # missing is workers in all.
    fits_now = workers_that_fit(worker, nodes)
    held = (f"the cluster's {fits_now} {'GPU' if worker.get('GPU') else 'CPU'}s"
            if worker in (GPU_WORKER, CPU_WORKER) else
            f"the {fits_now} workers of {worker} the cluster holds")
    raise ValueError(f"cluster size {num_workers} is larger than {held}; allowed cluster "
                     f"sizes are <= {fits_now} (or ask less per worker with "
                     "resources_per_worker, or add nodes)")


def _not_delivered(worker: dict[str, float], shape: str, nodes: list[dict[str, float]],
                   timeout_s: float) -> str:
    """`provision_workers`'s time-out: what the cluster holds, and where to look."""
    counts = [workers_that_fit(worker, [node]) for node in nodes]
    return (f"waited {timeout_s:.0f} s for the autoscaler to add nodes for {shape}; the "
            f"cluster holds {sum(counts)}, at most {max(counts, default=0)} on one node "
            f"(resources now: {_rounded(ray.cluster_resources())})."
            " See `ray status` and the autoscaler's log on the head "
            "(/tmp/ray/session_latest/logs/monitor.*) for failed launches (quota, "
            "instance type, setup commands); or raise provision_timeout_s, or start the "
            "nodes beforehand (min_workers in the cluster config)")


def _placed(worker: dict[str, float], num_workers: int, per_node: int | None) -> str:
    """N workers of `worker` as a trial places them, in words."""
    shape = f"{num_workers} workers of {worker}"
    if placement_strategy(num_workers, per_node) == STRICT_PACK:
        return f"{shape} on one node (a node holds up to {per_node})"
    return shape if per_node is None else f"{shape} packed {per_node} to a node"


def _check_autoscaler_can_place(worker: dict[str, float], num_workers: int,
                                per_node: int | None, bundles: list[dict[str, float]],
                                nodes: list[dict[str, float]],
                                node_types: list[tuple[dict[str, float], int]]) -> None:
    """ValueError when the running nodes plus every node the autoscaler may add can never
    place `bundles` (`provision_workers`'s request)."""
    # An on-prem (`local` provider) config declares no resources: Ray detects them at
    # start, so the most the autoscaler can add is unknown until its nodes are up.
    if not all(resources for resources, _ in node_types):
        return
    possible = workers_that_fit(worker, nodes) + sum(
        workers_that_fit(worker, [resources]) * count for resources, count in node_types)
    if possible < num_workers:
        raise ValueError(
            f"this autoscaling cluster can hold at most {possible} workers of {worker} "
            f"(running nodes plus max_workers of each node type in its config), fewer than "
            f"{num_workers}: use cluster sizes <= {possible}, or raise max_workers in the "
            "cluster config (cluster.yaml)")
    every_node = [*nodes, *(resources for resources, count in node_types
                            for _ in range(count))]
    if not bundles_fit(bundles, every_node):  # per_node is known: N singles fit `possible`
        per_node = int(per_node or 1)
        full = sum(workers_that_fit(worker, [node]) >= per_node for node in every_node)
        rest = num_workers % per_node
        raise ValueError(
            f"this autoscaling cluster cannot place {_placed(worker, num_workers, per_node)}"
            f" as the search profiles and trains them: that takes {num_workers // per_node} "
            f"nodes that each hold {per_node} (the most one node holds)"
            + (f" and one that holds {rest}" if rest else "") +
            f", and its running nodes plus max_workers of each node type in its config give "
            f"{full} nodes of {per_node}: raise max_workers of the node type that holds "
            f"{per_node} workers in the cluster config (cluster.yaml), or use cluster sizes "
            f"<= {full * per_node}")


def release_workers(workers: Workers | None) -> None:
    """Withdraw the autoscaler request of `provision_workers`, so idle nodes can go (the
    keeper stays, idle, until its driver ends)."""
    if workers is not None and workers.requested and ray.is_initialized():
        request_workers([])


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
