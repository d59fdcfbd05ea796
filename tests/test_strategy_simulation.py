"""The strategy simulation benchmark (issue 11, item 6), quick: no Ray session."""

import math

from result_checks import table_rows

from benchmarks.common import RESULTS_DIR
from benchmarks.prediction import strategy_simulation as simulation


def test_the_simulation_counts_launches_per_cluster_size_and_round():
    result = simulation.run(quick=True)
    rows = {(t["strategy"], t["objective"], t["pricing"]): t for t in result["table"]}
    cluster_sizes = result["grid"]["cluster_sizes"]
    # 3 N or more: the partial search's 2 launches (min and max N) differ from the full one's
    assert cluster_sizes == list(simulation.QUICK_CLUSTER_SIZES) and len(cluster_sizes) >= 3
    assert rows[("full", "time", "fixed")]["launches"] == len(cluster_sizes)  # a group per N
    assert rows[("partial", "time", "fixed")]["launches"] == 2  # min and max N
    assert rows[("partial", "time", "fixed")]["candidates"] == 6  # corners and middles
    feasible = sum(1 for n in cluster_sizes for b in result["grid"]["batch_sizes"]
                   if b % n == 0 and b // n <= simulation.MAX_LOCAL_BATCH)
    assert rows[("full", "time", "fixed")]["candidates"] == feasible
    for t in result["table"]:
        assert math.isfinite(t["regret_median"]) and t["profiling_s"] > 0
        if t["objective"] != "knee":  # the oracle minimises; a knee is not a minimum
            assert t["regret_median"] >= 0
    markdown = (RESULTS_DIR / "strategy_simulation_quick.md").read_text()
    assert len(table_rows(markdown, "| noise | strategy |")) == len(result["table"])
