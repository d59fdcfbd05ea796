"""A pricing of one's own: a price per node-hour plus a flat fee per node started."""

from dataclasses import asdict, dataclass

import numpy as np

import tula_ray
from tula_ray.models.pricing import billed_nodes


@dataclass(frozen=True)
class FlatFeePricing:
    usd_per_node: float = 1.0  # the fee for starting a node
    usd_per_node_hour: float = 2.0

    def cost_usd(self, time_s, num_workers, peak_mem_bytes=None, workers_per_node=None):
        hours = np.asarray(time_s, float) / 3600.0
        nodes = billed_nodes(num_workers, workers_per_node)  # whole nodes of G workers
        return nodes * (self.usd_per_node + self.usd_per_node_hour * hours)

    def to_dict(self):
        return {"kind": "flat-fee", **asdict(self)}


tula_ray.register_pricing("flat-fee", FlatFeePricing)
