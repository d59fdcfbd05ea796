"""Where a group of N workers goes on the cluster's nodes (issue 26, "Topology"), counted
over node resources given as dicts (no Ray call here; `workers` looks the nodes up).

`tula_ray.models.topology` decides the placement from N and G, the most workers one node
holds: N <= G on ONE node (STRICT_PACK), a larger N packed. These functions count what
given nodes hold under that placement, and build the ScalingConfig every run uses, so that
what the search profiles is placed as `train` and `tune_training` train it.
"""

from __future__ import annotations

from typing import Any

from tula_ray.models.topology import STRICT_PACK, placement_strategy

RESOURCE_SLACK = 1e-9  # float slack when dividing a node's resources by a worker's


def workers_that_fit(worker: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """How many workers of this shape the nodes hold together (each worker on one node)."""
    return sum(min(int(node.get(name, 0.0) / amount + RESOURCE_SLACK)
                   for name, amount in worker.items())
               for node in nodes)


def most_on_one_node(worker: dict[str, float], nodes: list[dict[str, float]]) -> int | None:
    """The most workers of this shape one of the nodes holds; None when none holds one."""
    return max((workers_that_fit(worker, [node]) for node in nodes), default=0) or None


def can_place(worker: dict[str, float], num_workers: int, per_node: int | None,
              nodes: list[dict[str, float]]) -> bool:
    """Whether `nodes` hold a group of N workers placed as a trial places it: N <= G on one
    node (STRICT_PACK), a larger N over any of them (PACK)."""
    counts = [workers_that_fit(worker, [node]) for node in nodes]
    if placement_strategy(num_workers, per_node) == STRICT_PACK:
        return max(counts, default=0) >= num_workers
    return sum(counts) >= num_workers


def holds_placed(worker: dict[str, float], num_workers: int, per_node: int | None,
                 nodes: list[dict[str, float]]) -> bool:
    """Whether `nodes` hold the N workers of a run placed as its trials place them
    (`can_place`), and, for N > G, a node that holds G: the cluster sizes <= G that the
    same search profiles each go on one node."""
    together = min(int(num_workers), per_node or int(num_workers))
    return (can_place(worker, num_workers, per_node, nodes)
            and can_place(worker, together, per_node, nodes))


def groups_that_fit(worker: dict[str, float], num_workers: int, per_node: int | None,
                    nodes: list[dict[str, float]]) -> int:
    """How many groups of N workers the nodes hold at once, each placed as a trial places
    it: N <= G on one node each (STRICT_PACK); a larger N over any nodes (PACK)."""
    counts = [workers_that_fit(worker, [node]) for node in nodes]
    if placement_strategy(num_workers, per_node) == STRICT_PACK:
        return sum(count // int(num_workers) for count in counts)
    return sum(counts) // max(int(num_workers), 1)


def bundles_fit(bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> bool:
    """Whether every bundle finds room on one of the nodes (first fit, largest first: exact
    for `topology.node_bundles`, whose G-worker bundles fit only on the nodes that hold the
    most workers, and whose one smaller bundle goes wherever room is left)."""
    free = [dict(node) for node in nodes]
    for bundle in sorted(bundles, key=lambda b: -sum(b.values())):
        node = next((n for n in free if workers_that_fit(bundle, [n]) >= 1), None)
        if node is None:
            return False
        for name, amount in bundle.items():
            node[name] = node.get(name, 0.0) - amount
    return True


def scaling_config(num_workers: int, resources: dict[str, float],
                   per_node: int | None) -> Any:
    """Ray Train's ScalingConfig for N workers of `resources` (GPU workers when they hold
    one), placed as the search profiles them (`topology.placement_strategy`): N <= G on
    one node, a larger N packed. The one place a run's ScalingConfig is built."""
    # Imported here: Ray Train is loaded by the runs that build a trainer, not by every
    # user of tula_ray.cluster (the CLI's replay, the storage check).
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=int(num_workers), use_gpu=resources.get("GPU", 0) > 0,
                         resources_per_worker=dict(resources),
                         placement_strategy=placement_strategy(num_workers, per_node))
