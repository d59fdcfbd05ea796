"""What a test left holding the shared Ray's CPUs, released (conftest's `ray_leftovers`).

A worker group that outlives its test (a search that failed mid-launch, a group stuck in
a collective) keeps its CPUs: every later test's task or group would then wait for them
without end, and a run that should fail one test in minutes hangs until CI's own timeout
without saying where. After each test on the shared Ray, the CPUs must come back within
`wait_s`; what still holds them then (alive actors with resources, placement groups) is
named, killed and removed, so that the failure stays the test's own.
"""

from __future__ import annotations

import time

import ray
from ray.util import state
from ray.util.placement_group import PlacementGroup, remove_placement_group

POLL_S = 0.25


def cpus_back(wait_s: float) -> bool:
    """Whether every CPU of the session is available again within `wait_s` seconds (Ray
    Train and Tune end their actors a moment after `fit` returns)."""
    deadline = time.monotonic() + wait_s
    while True:
        total = ray.cluster_resources().get("CPU", 0.0)
        if ray.available_resources().get("CPU", 0.0) >= total:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def release_leftovers(wait_s: float) -> list[str]:
    """Nothing when the CPUs come back within `wait_s`; otherwise what held them, each
    described, after killing the actors and removing the placement groups."""
    if cpus_back(wait_s):
        return []
    actors = [actor for actor in state.list_actors(filters=[("state", "=", "ALIVE")],
                                                   detail=True, limit=1000)
              if (actor.required_resources or {}).get("CPU", 0) > 0]
    groups = state.list_placement_groups(filters=[("state", "=", "CREATED")],
                                         detail=True, limit=1000)
    for actor in actors:
        ray.kill(_handle(actor.actor_id), no_restart=True)
    for group in groups:
        remove_placement_group(PlacementGroup(
            ray.PlacementGroupID(bytes.fromhex(group.placement_group_id))))
    return ([f"actor {actor.class_name} (pid {actor.pid}, {actor.required_resources})"
             for actor in actors]
            + [f"placement group {group.name or group.placement_group_id} "
               f"({group.bundles})" for group in groups])


def _handle(actor_id: str) -> ray.actor.ActorHandle:
    """A handle to an actor from its id, which is what Ray's state API gives."""
    from ray._private.worker import global_worker

    return global_worker.core_worker.get_actor_handle(ray.ActorID(bytes.fromhex(actor_id)))
