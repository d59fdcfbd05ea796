"""What a search itself cost, in node-hours (issue 45, item 4): `plan.meta["search_cost"]`.

The search holds nodes twice over: the memory probe runs on one worker, so one node, and
each launch (one Tune trial: a worker group of N workers, `TulaSearcher.sweeps`) holds
the nodes its N workers take, ceil(N / G) on nodes of G workers (N where G is unknown:
one node per worker, `tula_ray.models.pricing.billed_nodes`), for its wall time. Nodes
an autoscaler keeps up between launches, idle, are not counted: the search does not see
them. Dollars only where they follow from node-hours alone (a `FixedRate`: a price per
node-hour); other pricings bill what the search did not record (memory used, when each
node started and stopped). No Ray here (core module).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from tula_ray.arguments import check_number
from tula_ray.models.pricing import SECONDS_PER_HOUR, FixedRate, NodeBilling, billed_nodes

PROBE_NODES = 1  # the memory probe runs one worker


def search_cost(sweeps: Iterable[Mapping[str, Any]], probe_s: float,
                billing: NodeBilling) -> dict[str, Any]:
    """The search's node-hours, as JSON: `node_hours` in all, the memory probe's
    (`probe`: seconds, node_hours), and per cluster size N in increasing order
    (`by_num_workers`: launches, seconds, nodes each launch held, node_hours); `usd` (and
    per N) where the pricing is a `FixedRate`, priced by it on `billing`'s nodes.

    sweeps: the launches, each with num_workers and wall_s (`TulaSearcher.sweeps`; a
      resumed search's include those of the drivers before it, a failed launch too: it
      held its nodes). probe_s: the memory probe's wall time, seconds.
    billing: the plan's pricing and G, the workers one node holds (None: one per node).
    """
    check_number("probe_s", probe_s, low=0.0)
    per_size: dict[int, dict[str, Any]] = {}
    for index, sweep in enumerate(sweeps):
        entry = per_size.setdefault(int(sweep["num_workers"]), {"launches": 0, "seconds": 0.0})
        entry["launches"] += 1
        entry["seconds"] += check_number(f"sweeps[{index}]['wall_s']", sweep["wall_s"],
                                         low=0.0)
    by_size = [_launches_cost(n, per_size[n], billing) for n in sorted(per_size)]
    probe = {"seconds": float(probe_s),
             "node_hours": PROBE_NODES * float(probe_s) / SECONDS_PER_HOUR}
    cost: dict[str, Any] = {
        "node_hours": probe["node_hours"] + math.fsum(e["node_hours"] for e in by_size),
        "workers_per_node": billing.workers_per_node, "probe": probe,
        "by_num_workers": by_size}
    if _priced_by_node_hours(billing):
        probe["usd"] = float(billing.cost_usd(probe["seconds"], PROBE_NODES, math.nan))
        cost["usd"] = probe["usd"] + math.fsum(e["usd"] for e in by_size)
    return cost


def _priced_by_node_hours(billing: NodeBilling) -> bool:
    """Whether the pricing's dollars follow from node-hours alone (a FixedRate)."""
    return isinstance(billing.pricing, FixedRate)


def _launches_cost(num_workers: int, launches: Mapping[str, Any],
                   billing: NodeBilling) -> dict[str, Any]:
    """One cluster size's launches: their count, seconds, nodes and node-hours (and
    dollars, `search_cost`)."""
    nodes = float(billed_nodes(num_workers, billing.workers_per_node))
    entry = {"num_workers": num_workers, "launches": launches["launches"],
             "seconds": launches["seconds"], "nodes": nodes,
             "node_hours": nodes * launches["seconds"] / SECONDS_PER_HOUR}
    if _priced_by_node_hours(billing):
        entry["usd"] = float(billing.cost_usd(launches["seconds"], num_workers, math.nan))
    return entry
