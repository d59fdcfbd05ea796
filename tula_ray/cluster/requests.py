"""The autoscaler request of a driver, withdrawn when the driver goes (issue 45, item 3).

Ray-facing. `ray.autoscaler.sdk.request_resources` is persistent: it stays in the cluster's
GCS until the next call, whatever becomes of the driver that made it. Withdrawn only in a
`finally`, a driver killed by SIGKILL, an ssh drop (SIGHUP) or the OOM killer leaves it in
place, and the GPU nodes it asked for never scale down.

So a driver's requests go through its `RequestKeeper`: a detached actor on the driver's
node, named after the driver's job, which outlives the driver only long enough to notice
that it is gone. The driver beats every BEAT_S from a daemon thread; once no beat has come
for STALE_S, the keeper withdraws the request and exits. The search's trials (the same
job) find the keeper by name and hold the request for their own cluster size, so the
request follows the round being profiled, not the largest N (`provision_workers`).

The request is one value per cluster (ray-project/ray#13534): another driver's request,
or Ray Data's AutoscalingRequester purging its own expired ones, replaces it. The keeper
keeps its own record (`held`) and withdraws only when its driver is gone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

logger = logging.getLogger(__name__)

KEEPER_NAMESPACE = "tula_ray"
BEAT_S = 5.0
# Six missed beats: a driver whose main thread holds the GIL for a while (a large plan
# fitted, a checkpoint loaded) still beats in time; a dead driver's request is withdrawn
# within STALE_S + WATCH_POLL_S, under the minute issue 45 allows.
STALE_S = 30.0
WATCH_POLL_S = 1.0
HOLD_TIMEOUT_S = 60.0  # a keeper that does not answer within this is a fault, said so


def withdraw_request() -> None:
    """Clear the cluster's autoscaler request: its nodes may go once idle."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[])


@ray.remote(num_cpus=0, max_restarts=0)
class RequestKeeper:
    """Holds one driver's autoscaler request; withdraws it once the driver stops beating.

    An asyncio actor: `watch` runs for the keeper's life while `hold` and `beat` come in."""

    def __init__(self, stale_s: float = STALE_S) -> None:
        self._stale_s = stale_s
        self._last_beat = time.monotonic()
        self._bundles: list[dict[str, float]] = []

    async def hold(self, bundles: list[dict[str, float]]) -> None:
        """Make `bundles` the cluster's request (replacing any before: [] withdraws)."""
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=list(bundles))
        self._bundles = list(bundles)
        self._last_beat = time.monotonic()

    async def beat(self) -> None:
        self._last_beat = time.monotonic()

    async def held(self) -> list[dict[str, float]]:
        return self._bundles

    async def watch(self) -> None:
        """Until the driver stops beating; then withdraw the request and end the keeper."""
        while time.monotonic() - self._last_beat < self._stale_s:
            await asyncio.sleep(WATCH_POLL_S)
        if self._bundles:
            withdraw_request()
        ray.actor.exit_actor()


def keeper_name() -> str:
    """The keeper's name: one per job, so the driver's trials (its job) find it."""
    return f"tula-ray-request-{ray.get_runtime_context().get_job_id()}"


def job_keeper() -> ray.actor.ActorHandle | None:
    """This job's keeper, None when its driver started none (no autoscaling cluster)."""
    if not ray.is_initialized():  # ray.get_actor would start a Ray
        return None
    try:
        return ray.get_actor(keeper_name(), namespace=KEEPER_NAMESPACE)
    except ValueError:
        return None


def hold_request(keeper: ray.actor.ActorHandle, bundles: list[dict[str, float]]) -> None:
    """Make `bundles` the request `keeper` holds, waiting for it to be made."""
    ray.get(keeper.hold.remote(bundles), timeout=HOLD_TIMEOUT_S)


_beaten: dict[str, str] = {}  # keeper name -> the actor this process beats under it


def driver_keeper(stale_s: float = STALE_S) -> ray.actor.ActorHandle:
    """The driver's keeper, started on first use, beaten from a daemon thread for as long
    as this process is connected to Ray (the thread ends with the process, however it
    ends: then the keeper withdraws the request within `stale_s`). A keeper that ended
    (its driver silent for `stale_s`) is replaced by a new one."""
    name = keeper_name()
    keeper = RequestKeeper.options(
        name=name, namespace=KEEPER_NAMESPACE, lifetime="detached", get_if_exists=True,
        # on the driver's node: a worker node the autoscaler removes would take it along
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(stale_s)
    actor = keeper._actor_id.hex()
    if _beaten.get(name) != actor:
        _beaten[name] = actor
        keeper.watch.remote()
        threading.Thread(target=_beat, args=(keeper, name, actor), daemon=True,
                         name="tula-ray-request-beat").start()
    return keeper


def _beat(keeper: ray.actor.ActorHandle, name: str, actor: str) -> None:
    """Beat `keeper` until Ray is shut down in this process, or another keeper took over."""
    while ray.is_initialized() and _beaten.get(name) == actor:
        try:
            keeper.beat.remote()
        except Exception as error:  # noqa: BLE001 - Ray going down under the thread
            logger.debug("request keeper beat stopped: %s", error)
            return
        time.sleep(BEAT_S)
