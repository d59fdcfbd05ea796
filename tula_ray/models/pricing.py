"""Pricing models: what a training run costs (paper eq. 4b and §IV-C2).

A pricing model is anything with `cost_usd(time_s, num_workers, peak_mem_bytes,
workers_per_node=None)` (vectorised) and `to_dict()`; register its class to round-trip it
through a saved Plan. workers_per_node is G, the workers one node of the cluster holds
(None: unknown): a node is billed whole, so the node-hour pricings bill N workers as
ceil(N / G) nodes (`billed_nodes`) unless they are told that nodes are shared.

A pricing written before G (`cost_usd(time_s, num_workers, peak_mem_bytes)`) still
works: `NodeBilling` reads its signature once per class, calls it without G and warns
(a FutureWarning, which users see, as `mode=`'s): that signature is removed in tula-ray
0.3.0 (`OLD_COST_SIGNATURE_REMOVED_IN`).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tula_ray.arguments import check_bool, check_number

SECONDS_PER_HOUR = 3600.0
BYTES_PER_GB = 1e9  # the paper prices "per GB" of device memory
USD_PER_NODE_HOUR_DEFAULT = 2.48  # paper §IV-C1: one V100 on Google Cloud, US, 2025
USD_PER_GB_HOUR_DEFAULT = 0.15  # paper §IV-C2: memory-based pricing of a V100
MINIMUM_BILLED_S_DEFAULT = 60.0  # common per-second billing: one minute minimum
# The version that drops cost_usd without workers_per_node: it is always passed from then.
OLD_COST_SIGNATURE_REMOVED_IN = "0.3.0"


@runtime_checkable
class Pricing(Protocol):
    """Cost in USD of training for time_s seconds on N workers peaking at peak_mem_bytes
    each, on nodes of workers_per_node (G) workers (None: unknown)."""

    def cost_usd(self, time_s, num_workers, peak_mem_bytes,
                 workers_per_node: int | None = None) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


def billed_nodes(num_workers, workers_per_node: int | None,
                 shared_nodes: bool = False) -> np.ndarray:
    """The nodes a bill counts for N workers on nodes of G workers: ceil(N / G), a node
    is billed whole however few of its GPUs run; N / G when nodes are shared (each worker
    pays its share of one); N when G is unknown (None), one node per worker, as on the
    paper's cluster (§IV-B) and as before G was known."""
    n = np.asarray(num_workers, dtype=float)
    if workers_per_node is None:
        return n
    share = n / float(workers_per_node)
    return share if shared_nodes else np.ceil(share)


def fixed_rate_cost_usd(time_s, num_nodes, usd_per_node_hour: float) -> np.ndarray:
    """Eq. 4b: C = T * N * p, with N the nodes billed (`billed_nodes`) and p the price of
    one node per hour."""
    hours = np.asarray(time_s, dtype=float) / SECONDS_PER_HOUR
    return hours * np.asarray(num_nodes, dtype=float) * usd_per_node_hour


def memory_rate_cost_usd(time_s, num_workers, peak_mem_bytes, usd_per_gb_hour: float) -> np.ndarray:
    """§IV-C2: each node pays for the device memory it uses, C = T * N * (M / GB) * p_GB."""
    gigabytes = np.asarray(peak_mem_bytes, dtype=float) / BYTES_PER_GB
    return fixed_rate_cost_usd(time_s, num_workers, 1.0) * gigabytes * usd_per_gb_hour


@dataclass(frozen=True)
class FixedRate:
    """A fixed price per node-hour (eq. 4b), the common cloud price list.

    usd_per_node_hour: the price of one node, all of its G workers' GPUs (the instance's
      price); where G is unknown, of one worker's node.
    shared_nodes: False (default), a node is billed whole: N workers cost ceil(N / G)
      nodes; True, the nodes are shared with other jobs and N workers pay N / G of them.
    """

    usd_per_node_hour: float = USD_PER_NODE_HOUR_DEFAULT
    shared_nodes: bool = False

    def __post_init__(self) -> None:
        check_number("usd_per_node_hour", self.usd_per_node_hour, low=0.0, low_open=True)
        check_bool("shared_nodes", self.shared_nodes)

    def cost_usd(self, time_s, num_workers, peak_mem_bytes=None,
                 workers_per_node: int | None = None) -> np.ndarray:
        nodes = billed_nodes(num_workers, workers_per_node, self.shared_nodes)
        return fixed_rate_cost_usd(time_s, nodes, self.usd_per_node_hour)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", **asdict(self)}


@dataclass(frozen=True)
class MemoryRate:
    """A price per GB-hour of device memory used (§IV-C2): each worker pays for the
    memory it uses, by design, so the nodes' size (G) does not change the bill."""

    usd_per_gb_hour: float = USD_PER_GB_HOUR_DEFAULT

    def __post_init__(self) -> None:
        check_number("usd_per_gb_hour", self.usd_per_gb_hour, low=0.0, low_open=True)

    def cost_usd(self, time_s, num_workers, peak_mem_bytes,
                 workers_per_node: int | None = None) -> np.ndarray:
        return memory_rate_cost_usd(time_s, num_workers, peak_mem_bytes, self.usd_per_gb_hour)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "memory", **asdict(self)}


@dataclass(frozen=True)
class PerSecondBilling:
    """A node-hour price billed per started second, with a minimum charge per node; nodes
    are billed whole unless `shared_nodes`, as `FixedRate`'s.

    An example of a user-defined scheme: any class with cost_usd and to_dict works.
    """

    usd_per_node_hour: float = USD_PER_NODE_HOUR_DEFAULT
    minimum_s: float = MINIMUM_BILLED_S_DEFAULT
    shared_nodes: bool = False

    def __post_init__(self) -> None:
        check_number("usd_per_node_hour", self.usd_per_node_hour, low=0.0, low_open=True)
        check_number("minimum_s", self.minimum_s, low=0.0)
        check_bool("shared_nodes", self.shared_nodes)

    def cost_usd(self, time_s, num_workers, peak_mem_bytes=None,
                 workers_per_node: int | None = None) -> np.ndarray:
        billed_s = np.maximum(np.ceil(np.asarray(time_s, dtype=float)), self.minimum_s)
        nodes = billed_nodes(num_workers, workers_per_node, self.shared_nodes)
        return fixed_rate_cost_usd(billed_s, nodes, self.usd_per_node_hour)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "per-second", **asdict(self)}


_TAKES_G: dict[type, bool] = {}  # per Pricing class: does its cost_usd take workers_per_node


def takes_workers_per_node(pricing: Pricing) -> bool:
    """Whether `pricing.cost_usd` takes workers_per_node (or **kwargs), read once per class;
    a class whose cost_usd does not gets one FutureWarning, naming what to add."""
    kind = type(pricing)
    if kind not in _TAKES_G:
        try:
            parameters = inspect.signature(pricing.cost_usd).parameters.values()
        except (TypeError, ValueError):  # no signature to read: called as the old one was
            parameters = ()
        _TAKES_G[kind] = any(p.name == "workers_per_node" or p.kind is p.VAR_KEYWORD
                             for p in parameters)
        if not _TAKES_G[kind]:
            warnings.warn(
                f"{kind.__name__}.cost_usd(time_s, num_workers, peak_mem_bytes) takes no "
                "workers_per_node: it is called without it, so its costs ignore that a node "
                "is billed whole; add `workers_per_node=None` to its parameters (G, the "
                "workers one node holds; None: unknown): the signature without it is "
                f"removed in tula-ray {OLD_COST_SIGNATURE_REMOVED_IN}.", FutureWarning,
                stacklevel=3)
    return _TAKES_G[kind]


@dataclass(frozen=True)
class NodeBilling:
    """A pricing on one cluster: what a cost needs beyond its data (the pricing and G, the
    workers one node holds; None: unknown), so that every cost of a plan is in the same
    whole nodes. A pricing whose cost_usd predates workers_per_node is called without it
    (deprecated, `takes_workers_per_node`)."""

    pricing: Pricing
    workers_per_node: int | None = None

    def cost_usd(self, time_s, num_workers, peak_mem_bytes) -> np.ndarray:
        if takes_workers_per_node(self.pricing):
            return self.pricing.cost_usd(time_s, num_workers, peak_mem_bytes,
                                         workers_per_node=self.workers_per_node)
        return self.pricing.cost_usd(time_s, num_workers, peak_mem_bytes)


PRICINGS: dict[str, type] = {  # kind (in to_dict) -> class; `register_pricing` adds one
    "fixed": FixedRate, "memory": MemoryRate, "per-second": PerSecondBilling,
}


def register_pricing(kind: str, cls: type) -> None:
    """Let `pricing_from_dict` rebuild `cls` from its `to_dict()` (which must say this kind)."""
    PRICINGS[kind] = cls


def pricing_to_dict(pricing: Pricing) -> dict[str, Any]:
    data = pricing.to_dict()
    if "kind" not in data:
        raise ValueError(f"{type(pricing).__name__}.to_dict() must contain a 'kind' key")
    return data


def pricing_from_dict(data: dict[str, Any]) -> Pricing:
    fields = dict(data)
    kind = fields.pop("kind", None)
    if kind not in PRICINGS:
        raise ValueError(f"pricing kind {kind!r} is not registered; known: {sorted(PRICINGS)} "
                         "(register_pricing(kind, cls) adds one)")
    return PRICINGS[kind](**fields)


def parse_pricing(spec: Pricing | dict | str) -> Pricing:
    """A Pricing from an object, a dict, or a string: a registered kind, alone or with its
    first parameter after a colon: "fixed", "fixed:2.48" (USD per node-hour), "memory",
    "memory:0.15" (USD per GB-hour), "per-second", or a kind `register_pricing` added;
    ":shared" last says the nodes are shared (`shared_nodes=True`: "fixed:2.48:shared")."""
    if isinstance(spec, dict):
        return pricing_from_dict(spec)
    if isinstance(spec, str):
        kind, _, rate = spec.partition(":")
        rate, shared = _shared_suffix(rate)
        if kind not in PRICINGS or ":" in rate:
            raise ValueError(f"pricing {spec!r} is not understood; use 'fixed', "
                             "'fixed:USD_PER_NODE_HOUR', 'memory' or 'memory:USD_PER_GB_HOUR', "
                             f"another registered kind ({sorted(PRICINGS)}), or a Pricing "
                             "object; ':shared' last for nodes shared with other jobs")
        options = {"shared_nodes": True} if shared else {}
        try:
            return PRICINGS[kind](*([float(rate)] if rate else []), **options)
        except ValueError as error:
            raise ValueError(f"pricing {spec!r}: {error}") from None
        except TypeError:
            if not shared:
                raise
            raise ValueError(f"pricing {spec!r}: {kind!r} has no shared_nodes option (it "
                             "does not bill whole nodes); drop ':shared'") from None
    if isinstance(spec, Pricing):
        return spec
    raise ValueError(f"pricing {spec!r} is not a Pricing, a dict or a string")


def _shared_suffix(parameters: str) -> tuple[str, bool]:
    """(what is left, whether it ended in "shared"): "2.48:shared" -> ("2.48", True)."""
    if parameters == "shared":
        return "", True
    if parameters.endswith(":shared"):
        return parameters.removesuffix(":shared"), True
    return parameters, False
