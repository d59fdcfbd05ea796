"""Pricing models: what a training run costs (paper eq. 4b and §IV-C2).

A pricing model is anything with `cost_usd(time_s, num_workers, peak_mem_bytes)`
(vectorised) and `to_dict()`; register its class to round-trip it through a
saved Plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tula_ray.arguments import check_number

SECONDS_PER_HOUR = 3600.0
BYTES_PER_GB = 1e9  # the paper prices "per GB" of device memory
USD_PER_NODE_HOUR_DEFAULT = 2.48  # paper §IV-C1: one V100 on Google Cloud, US, 2025
USD_PER_GB_HOUR_DEFAULT = 0.15  # paper §IV-C2: memory-based pricing of a V100
MINIMUM_BILLED_S_DEFAULT = 60.0  # common per-second billing: one minute minimum


@runtime_checkable
class Pricing(Protocol):
    """Cost in USD of training for time_s seconds on N workers peaking at peak_mem_bytes each."""

    def cost_usd(self, time_s, num_workers, peak_mem_bytes) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


def fixed_rate_cost_usd(time_s, num_workers, usd_per_node_hour: float) -> np.ndarray:
    """Eq. 4b: C = T * N * p, with p the price of one node per hour."""
    hours = np.asarray(time_s, dtype=float) / SECONDS_PER_HOUR
    return hours * np.asarray(num_workers, dtype=float) * usd_per_node_hour


def memory_rate_cost_usd(time_s, num_workers, peak_mem_bytes, usd_per_gb_hour: float) -> np.ndarray:
    """§IV-C2: each node pays for the device memory it uses, C = T * N * (M / GB) * p_GB."""
    gigabytes = np.asarray(peak_mem_bytes, dtype=float) / BYTES_PER_GB
    return fixed_rate_cost_usd(time_s, num_workers, 1.0) * gigabytes * usd_per_gb_hour


@dataclass(frozen=True)
class FixedRate:
    """A fixed price per node-hour (eq. 4b), the common cloud price list."""

    usd_per_node_hour: float = USD_PER_NODE_HOUR_DEFAULT

    def __post_init__(self) -> None:
        check_number("usd_per_node_hour", self.usd_per_node_hour, low=0.0, low_open=True)

    def cost_usd(self, time_s, num_workers, peak_mem_bytes=None) -> np.ndarray:
        return fixed_rate_cost_usd(time_s, num_workers, self.usd_per_node_hour)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fixed", **asdict(self)}


@dataclass(frozen=True)
class MemoryRate:
    """A price per GB-hour of device memory used (§IV-C2)."""

    usd_per_gb_hour: float = USD_PER_GB_HOUR_DEFAULT

    def __post_init__(self) -> None:
        check_number("usd_per_gb_hour", self.usd_per_gb_hour, low=0.0, low_open=True)

    def cost_usd(self, time_s, num_workers, peak_mem_bytes) -> np.ndarray:
        return memory_rate_cost_usd(time_s, num_workers, peak_mem_bytes, self.usd_per_gb_hour)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "memory", **asdict(self)}


@dataclass(frozen=True)
class PerSecondBilling:
    """A node-hour price billed per started second, with a minimum charge per node.

    An example of a user-defined scheme: any class with cost_usd and to_dict works.
    """

    usd_per_node_hour: float = USD_PER_NODE_HOUR_DEFAULT
    minimum_s: float = MINIMUM_BILLED_S_DEFAULT

    def __post_init__(self) -> None:
        check_number("usd_per_node_hour", self.usd_per_node_hour, low=0.0, low_open=True)
        check_number("minimum_s", self.minimum_s, low=0.0)

    def cost_usd(self, time_s, num_workers, peak_mem_bytes=None) -> np.ndarray:
        billed_s = np.maximum(np.ceil(np.asarray(time_s, dtype=float)), self.minimum_s)
        return fixed_rate_cost_usd(billed_s, num_workers, self.usd_per_node_hour)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "per-second", **asdict(self)}


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
    "memory:0.15" (USD per GB-hour), "per-second", or a kind `register_pricing` added."""
    if isinstance(spec, dict):
        return pricing_from_dict(spec)
    if isinstance(spec, str):
        kind, _, rate = spec.partition(":")
        if kind not in PRICINGS:
            raise ValueError(f"pricing {spec!r} is not understood; use 'fixed', "
                             "'fixed:USD_PER_NODE_HOUR', 'memory' or 'memory:USD_PER_GB_HOUR', "
                             f"another registered kind ({sorted(PRICINGS)}), or a Pricing object")
        try:
            return PRICINGS[kind](float(rate)) if rate else PRICINGS[kind]()
        except ValueError as error:
            raise ValueError(f"pricing {spec!r}: {error}") from None
    if isinstance(spec, Pricing):
        return spec
    raise ValueError(f"pricing {spec!r} is not a Pricing, a dict or a string")
