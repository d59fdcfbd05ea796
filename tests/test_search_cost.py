"""What a search itself cost in node-hours (issue 45, item 4): `plan.meta["search_cost"]`
from the launches the searcher records and the memory probe's seconds, each launch
holding ceil(N / G) nodes; its line in the summary; plans saved before it still load and
summarise. No Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tula_ray.models.pricing import FixedRate, MemoryRate, NodeBilling
from tula_ray.planning.plan import Plan
from tula_ray.planning.search_cost import search_cost
from tula_ray.planning.summary import search_cost_line

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"
HOUR_S = 3600.0


def _sweep(num_workers: int, wall_s: float, round_: int = 1, error: bool = False) -> dict:
    """One launch as `TulaSearcher.sweeps` records it."""
    return {"round": round_, "num_workers": num_workers, "global_batches": [32, 256],
            "wall_s": wall_s, "error": error}


def test_one_worker_per_node_holds_n_nodes_per_launch():
    sweeps = [_sweep(1, 360.0), _sweep(2, 720.0), _sweep(1, 180.0, round_=2)]
    cost = search_cost(sweeps, 36.0, NodeBilling(FixedRate(2.0), None))
    assert cost["probe"] == pytest.approx({"seconds": 36.0, "node_hours": 0.01, "usd": 0.02})
    n1, n2 = cost["by_num_workers"]
    assert (n1["num_workers"], n1["launches"], n1["seconds"], n1["nodes"]) == (1, 2, 540.0, 1)
    assert n1["node_hours"] == pytest.approx(0.15)
    assert (n2["num_workers"], n2["launches"], n2["nodes"]) == (2, 1, 2)
    assert n2["node_hours"] == pytest.approx(0.4)  # two nodes for 0.2 h
    assert cost["node_hours"] == pytest.approx(0.01 + 0.15 + 0.4)
    assert cost["usd"] == pytest.approx(2.0 * cost["node_hours"])
    assert cost["workers_per_node"] is None
    assert json.loads(json.dumps(cost)) == cost  # saved with the plan as it is


def test_on_four_worker_nodes_n_1_to_4_hold_one_node_each():
    sweeps = [_sweep(n, HOUR_S) for n in (1, 2, 3, 4)] + [_sweep(5, HOUR_S)]
    cost = search_cost(sweeps, 0.0, NodeBilling(FixedRate(3.0), 4))
    by_n = {entry["num_workers"]: entry for entry in cost["by_num_workers"]}
    assert [by_n[n]["node_hours"] for n in (1, 2, 3, 4, 5)] == [1.0, 1.0, 1.0, 1.0, 2.0]
    assert [by_n[n]["usd"] for n in (1, 2, 3, 4)] == [3.0] * 4
    assert cost["node_hours"] == pytest.approx(6.0)
    assert cost["workers_per_node"] == 4


def test_a_resumed_search_counts_every_drivers_launches_and_failed_ones():
    # The sweeps a resumed search restores (the first driver's), then its own; a launch
    # that failed held its nodes all the same.
    before_the_kill = [_sweep(1, 600.0), _sweep(2, 300.0, error=True)]
    after = [_sweep(2, 900.0, round_=2)]
    cost = search_cost(before_the_kill + after, 60.0, NodeBilling(FixedRate(1.0), 2))
    (n1, n2) = cost["by_num_workers"]
    assert (n2["launches"], n2["seconds"], n2["nodes"]) == (2, 1200.0, 1)
    assert cost["node_hours"] == pytest.approx((60.0 + 600.0 + 1200.0) / HOUR_S)


def test_dollars_only_where_node_hours_price_them():
    cost = search_cost([_sweep(2, HOUR_S)], 10.0, NodeBilling(MemoryRate(0.15), None))
    assert "usd" not in cost and "usd" not in cost["by_num_workers"][0]
    assert "usd" not in cost["probe"]
    assert cost["node_hours"] == pytest.approx(2.0 + 10.0 / HOUR_S)


def test_bad_seconds_are_named():
    with pytest.raises(ValueError, match=r"probe_s=-1"):
        search_cost([], -1.0, NodeBilling(FixedRate(), None))
    with pytest.raises(ValueError, match=r"sweeps\[1\]\['wall_s'\]=nan"):
        search_cost([_sweep(1, 1.0), _sweep(1, float("nan"))], 0.0,
                    NodeBilling(FixedRate(), None))


def test_the_summary_line_names_the_node_hours_of_the_probe_and_each_n():
    cost = search_cost([_sweep(1, 360.0), _sweep(1, 360.0), _sweep(2, 360.0)], 36.0,
                       NodeBilling(FixedRate(2.0), None))
    assert search_cost_line(cost) == (
        "the search: 0.41 node-hours (memory probe: 0.01; N=1: 0.2 in 2 launches; "
        "N=2: 0.2 in 1 launch), $0.82 at the plan's price")
    assert search_cost_line(None) == ""


def _recorded_plan_path() -> Path:
    recorded = sorted(RESULTS.glob("*.plan*.json"))
    assert recorded
    return recorded[0]


def test_a_plan_saved_before_search_cost_loads_and_summarises():
    data = json.loads(_recorded_plan_path().read_text())
    assert "search_cost" not in data["meta"]  # recorded before the key
    plan = Plan.from_json(json.dumps(data))
    assert "the search:" not in plan.summary()
    data["meta"]["search_cost"] = search_cost([_sweep(1, 360.0)], 36.0,
                                              NodeBilling(FixedRate(2.0), None))
    again = Plan.from_json(Plan.from_json(json.dumps(data)).to_json())
    assert again.meta["search_cost"] == data["meta"]["search_cost"]
    assert "the search: 0.11 node-hours (memory probe: 0.01; N=1: 0.1 in 1 launch), " \
        "$0.22 at the plan's price" in again.summary()
