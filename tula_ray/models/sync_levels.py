"""Eq. 2c, synchronisation time against the cluster size, on one node or several (no Ray).

A collective is `units(N)`, what its bandwidth time is proportional to, and optionally
`hops(N)`, the messages in sequence that each pay a link's latency (ring all-reduce:
1 - 1/N and 2 (N - 1)). Sync has two levels (issue 26): the ring among one node's
workers (NVLink, PCIe, shared memory) and the ring among the nodes (the network), each
in the alpha-beta form alpha * hops(n) + beta * units(n) over the n members of that
level: NCCL's hierarchical all-reduce on several nodes, and the paper's units(N) * beta
on one node with alpha = 0. On top, exposed sync may rise or fall with the local batch b
(stragglers; the all-reduce a longer backward hides): + units(N) * beta1 * b, never
below 0.

`fit_sync_levels` fits the terms the rows identify: a level's beta where a row has
that level, its alpha where two or more sizes of that level were profiled; the rest
fall back as its `SyncFit.notes` say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
from scipy.optimize import lsq_linear

from tula_ray.models.topology import nodes_for

def ring_allreduce_units(num_workers: np.ndarray) -> np.ndarray:
    """Eq. 2c, ring all-reduce: bandwidth term proportional to (1 - 1/N); 0 for N = 1."""
    n = np.asarray(num_workers, dtype=float)
    return 1.0 - 1.0 / n


def parameter_server_units(num_workers: np.ndarray) -> np.ndarray:
    """Eq. 2c, central parameter server: proportional to N; 0 for N = 1 (nothing to sync)."""
    n = np.asarray(num_workers, dtype=float)
    return np.where(n > 1, n, 0.0)


def ring_allreduce_hops(num_workers: np.ndarray) -> np.ndarray:
    """Ring all-reduce's latency term: 2 (N - 1) messages in sequence (reduce-scatter,
    then all-gather), each paying the link's latency alpha; 0 for N = 1."""
    n = np.asarray(num_workers, dtype=float)
    return 2.0 * (n - 1.0)


COLLECTIVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "ring": ring_allreduce_units,
    "ps": parameter_server_units,
}
# A collective's latency term (hops(N), 0 for N = 1); one without has none fitted.
COLLECTIVE_HOPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "ring": ring_allreduce_hops,
}


def register_collective(name: str, units: Callable[[np.ndarray], np.ndarray],
                        hops: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """Add a synchronisation model: `units(N)` is what sync time is proportional to, and
    `hops(N)` (optional) the messages in sequence that each pay a link's latency.

    Example: a tree all-reduce, `register_collective("tree", lambda n: np.log2(n))`.
    Both must return 0 for N = 1, where data-parallel training does not synchronise.
    """
    for term, function in (("units", units), ("hops", hops)):
        if function is not None and float(np.asarray(function(np.array([1])))[0]) != 0.0:
            raise ValueError(f"collective {name!r}: {term}(1) must be 0 (a single worker "
                             "never syncs)")
    COLLECTIVES[name] = units
    if hops is None:
        COLLECTIVE_HOPS.pop(name, None)
    else:
        COLLECTIVE_HOPS[name] = hops


def _hops(name: str, num_workers: np.ndarray) -> np.ndarray:
    hops = COLLECTIVE_HOPS.get(name)
    n = np.asarray(num_workers, dtype=float)
    return np.zeros_like(n) if hops is None else hops(n)


def collective_units(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The registered collective `name`'s units of traffic per N (`COLLECTIVES`); an
    unknown name raises, naming the known ones."""
    if name not in COLLECTIVES:
        raise ValueError(f"collective {name!r} is unknown; known: {sorted(COLLECTIVES)}")
    return COLLECTIVES[name]


def packed_nodes(num_workers, workers_per_node: int | None) -> np.ndarray:
    """`topology.nodes_for` over an array of N: the nodes each N spans when packed."""
    def one(n: float) -> float:
        return float(nodes_for(int(n), workers_per_node))

    return np.vectorize(one, otypes=[float])(np.asarray(num_workers, dtype=float))


@dataclass(frozen=True)
class LevelTerms:
    """The four terms of the two-level all-reduce of N workers on k nodes: the hops and
    units of the ring within a node (ceil(N / k) workers) and across the k nodes."""

    intra_hops: np.ndarray
    intra_units: np.ndarray
    inter_hops: np.ndarray
    inter_units: np.ndarray


def level_terms(collective: str, num_workers, num_nodes) -> LevelTerms:
    """Hierarchical all-reduce (NCCL's on several nodes): reduce within each node, all-reduce
    across the nodes, broadcast within each node. Each level's ring takes its own
    alpha-beta time; on one node the network level is 0, on one-device nodes the node's."""
    n, k = np.broadcast_arrays(np.asarray(num_workers, dtype=float),
                               np.maximum(np.asarray(num_nodes, dtype=float), 1.0))
    per_node = np.ceil(n / k)
    units = collective_units(collective)
    return LevelTerms(_hops(collective, per_node), units(per_node),
                      _hops(collective, k), units(k))


def exposed_sync_s(level_s, units, per_unit_per_sample_s: float, local_batch) -> np.ndarray:
    """Eq. 2c with overlap: max(0, levels + units(N) * beta1 * b). The all-reduce that a
    longer backward hides (beta1 < 0) cannot make the step shorter than its compute."""
    change = per_unit_per_sample_s * np.asarray(local_batch, dtype=float) * np.asarray(units,
                                                                                     dtype=float)
    return np.maximum(np.asarray(level_s, dtype=float) + change, 0.0)


@dataclass(frozen=True)
class SyncFit:
    """Eq. 2c's fitted terms. None: not identified by the rows (the network's: the node's
    value is used; see `notes`)."""

    intra_per_unit_s: float
    per_unit_per_sample_s: float = 0.0
    intra_latency_s: float = 0.0
    inter_per_unit_s: float | None = None
    inter_latency_s: float | None = None
    notes: tuple[str, ...] = ()


def rows_nodes(rows: pd.DataFrame, workers_per_node: int | None) -> np.ndarray:
    """Each row's measured `num_nodes`; `packed_nodes(N, G)` where the row has none
    (profiles written before it was recorded)."""
    n = rows["num_workers"].to_numpy(float)
    fallback = packed_nodes(n, workers_per_node)
    if "num_nodes" not in rows:
        return fallback
    measured = pd.to_numeric(rows["num_nodes"], errors="coerce").to_numpy(float)
    return np.where(np.isfinite(measured) & (measured >= 1), measured, fallback)


def fit_sync_levels(rows: pd.DataFrame, collective: str, workers_per_node: int | None = None,
                    *, latency: bool = True) -> SyncFit | None:
    """Eq. 2c's terms from the multi-worker rows; None when there are none.

    latency=False fits no alpha: the overlap form's p-norm, which bends small syncs
    itself, scales the bandwidth terms alone (with an alpha it is not identified).

    Least squares with every alpha and beta >= 0 and beta1 of either sign, residuals
    relative to each row's STEP time (what predictions are judged by): a near-zero sync
    does not dominate the fit. With one term and one b, the median of sync / term.
    """
    n = rows["num_workers"].to_numpy(float)
    synced = collective_units(collective)(n) > 0
    if not synced.any():
        return None
    n, k = n[synced], rows_nodes(rows, workers_per_node)[synced]
    b = rows["local_batch"].to_numpy(float)[synced]
    sync = np.maximum(rows["sync_time_s"].to_numpy(float)[synced], 0.0)
    weight = 1.0 / rows["step_time_s"].to_numpy(float)[synced]
    terms = level_terms(collective, n, k)
    columns, notes = _identified_terms(terms, collective if latency else None,
                                       np.ceil(n / k), k, b, collective_units(collective)(n))
    names = list(columns)
    if len(names) == 1:
        only = columns[names[0]]
        values = {names[0]: float(np.median(sync[only > 0] / only[only > 0]))}
    else:
        design = np.column_stack([columns[name] for name in names]) * weight[:, None]
        lower = [-np.inf if name == "per_unit_per_sample_s" else 0.0 for name in names]
        # bvls solves this small problem exactly (trf stops at its cost tolerance).
        solution = lsq_linear(design, sync * weight, bounds=(lower, np.inf), method="bvls").x
        values = {name: float(value) for name, value in zip(names, solution)}
    if "intra_per_unit_s" not in values:  # one device per node: only the network level
        values["intra_per_unit_s"] = values["inter_per_unit_s"]
        values["intra_latency_s"] = values.get("inter_latency_s", 0.0)
    if workers_per_node is not None and "inter_per_unit_s" not in values:
        notes.append(f"no profile spans two nodes: a cluster size above {workers_per_node} "
                     "workers (one node) is predicted with the node's sync terms")
    return SyncFit(notes=tuple(notes), **values)


def _identified_terms(terms: LevelTerms, collective: str | None, per_node: np.ndarray,
                      nodes: np.ndarray, local_batch: np.ndarray, units: np.ndarray
                      ) -> tuple[dict[str, np.ndarray], list[str]]:
    """The columns the rows identify, by name of `SyncFit` field, and why any is left out
    (collective None: no latency term)."""
    columns, notes = {}, []
    has_hops = collective is not None and collective in COLLECTIVE_HOPS
    for level, members, hops, level_units in (
            ("intra", per_node, terms.intra_hops, terms.intra_units),
            ("inter", nodes, terms.inter_hops, terms.inter_units)):
        if not (level_units > 0).any():
            continue
        columns[f"{level}_per_unit_s"] = level_units
        sizes = np.unique(members[members > 1])
        if has_hops and len(sizes) >= 2:
            columns[f"{level}_latency_s"] = hops
        elif has_hops and level == "inter":
            notes.append("one node count profiled: the network's latency is folded into "
                         "its per-unit term")
    if len(np.unique(local_batch)) >= 2:
        columns["per_unit_per_sample_s"] = units * local_batch
    return columns, notes
