"""Where N workers sit: on how many nodes, placed how (issue 26, "Topology"). No Ray here.

G, the workers one node holds, tells intra-node from inter-node communication: N <= G
workers share one node (NVLink, or one machine's memory), a larger N spans ceil(N / G)
nodes and its all-reduce crosses the network. What is profiled must be what is trained,
so both place a cluster size the same way: N <= G on ONE node (Ray's STRICT_PACK: a
best-effort PACK may split N = 4 over two half-free nodes), a larger N packed onto as
few nodes as Ray can (PACK). G None means one node holds every cluster size (a local
machine, or a cluster whose shape is not known): everything is one level, as in the paper.
"""

from __future__ import annotations

import math

STRICT_PACK = "STRICT_PACK"
PACK = "PACK"


def nodes_for(num_workers: int, workers_per_node: int | None) -> int:
    """The nodes N workers span when packed: ceil(N / G); 1 when G is unknown."""
    if workers_per_node is None or workers_per_node <= 0:
        return 1
    return max(1, math.ceil(int(num_workers) / int(workers_per_node)))


def placement_strategy(num_workers: int, workers_per_node: int | None) -> str:
    """Ray's placement strategy for N workers: STRICT_PACK when one node holds them all
    (so N <= G never straddles two nodes), PACK otherwise (and when G is unknown: Ray's
    default, which packs where it can)."""
    if workers_per_node is not None and 0 < int(num_workers) <= int(workers_per_node):
        return STRICT_PACK
    return PACK


def worker_bundles(worker: dict[str, float], num_workers: int,
                   workers_per_node: int | None) -> list[dict[str, float]]:
    """The bundles to ask the autoscaler for, matching the trial's placement: N <= G as
    ONE bundle of N workers (a node that holds them all: what STRICT_PACK needs), a
    larger N as N bundles of one worker (PACK fills nodes; the autoscaler bin-packs)."""
    if placement_strategy(num_workers, workers_per_node) == STRICT_PACK:
        return [{name: amount * num_workers for name, amount in worker.items()}]
    return [dict(worker) for _ in range(int(num_workers))]


def node_bundles(worker: dict[str, float], num_workers: int,
                 workers_per_node: int | None) -> list[dict[str, float]]:
    """The bundles an autoscaler is asked for so that N workers come placed as the trial
    places them: ONE bundle of N when N <= G (STRICT_PACK, as `worker_bundles`), and for a
    larger N `nodes_for(N, G)` bundles of G workers, the last holding the rest (PACK: as
    few nodes as Ray can). An autoscaler request takes bundles but no placement strategy,
    and given N one-worker bundles it may launch N one-worker nodes beside a type that
    holds G: then no node would hold the N <= G that STRICT_PACK places on one, and N
    would span N nodes, not the `nodes_for(N, G)` the model predicts. G None: N bundles
    of one worker (nothing known to pack onto)."""
    if workers_per_node is None or workers_per_node <= 0:
        return worker_bundles(worker, num_workers, None)
    per_node, total = int(workers_per_node), int(num_workers)
    sizes = [min(per_node, total - start) for start in range(0, total, per_node)]
    return [{name: amount * size for name, amount in worker.items()} for size in sizes]
