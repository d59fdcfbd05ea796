"""Topology in the plan (issue 26, item 1), without Ray: the two-level sync model, the
corners partial search profiles, and the plan's num_nodes. Ground truth is written here
from the alpha-beta form itself, never by calling tula_ray.models.perf."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tula_ray import build_plan
from tula_ray.models import perf, sync_levels
from tula_ray.models.topology import nodes_for
from tula_ray.planning.search_strategies import make_search_strategy, topology_options
from tula_ray.profile_table import profile_frame
from tula_ray.space import Candidate, SearchSpace, corner_sizes

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")

G = 4  # workers per node: a 2 x 4 GPU stand-in
INTRA_ALPHA, INTRA_BETA = 2e-4, 4e-3  # NVLink-like: small latency per hop, fast
INTER_ALPHA, INTER_BETA = 3e-3, 4e-2  # the network: ten times slower
COMPUTE = (2e-3, 1e-4)  # intercept, per sample


def ring(n):
    """Ring all-reduce over n members: (hops, units) = (2 (n - 1), 1 - 1/n)."""
    return 2.0 * (n - 1), 1.0 - 1.0 / n


def true_sync(num_workers, num_nodes, inter_alpha=INTER_ALPHA, intra_alpha=INTRA_ALPHA):
    """Reduce within each node, all-reduce across the nodes: each level its own ring."""
    intra_hops, intra_units = ring(math.ceil(num_workers / num_nodes))
    inter_hops, inter_units = ring(num_nodes)
    return (intra_alpha * intra_hops + INTRA_BETA * intra_units
            + inter_alpha * inter_hops + INTER_BETA * inter_units)


def rows_for(sizes, batches, workers_per_node=G, record_nodes=True, **truth):
    rows = []
    for n in sizes:
        for b in batches:
            if b % n:
                continue
            k = math.ceil(n / workers_per_node)
            compute = COMPUTE[0] + COMPUTE[1] * b / n
            sync = true_sync(n, k, **truth) if n > 1 else 0.0
            rows.append({"num_workers": n, "global_batch": b, "local_batch": b // n,
                         "compute_time_s": compute, "sync_time_s": sync,
                         "step_time_s": compute + sync, "status": "ok",
                         "peak_mem_bytes": 5e7 + 3e5 * b / n,
                         **({"num_nodes": k} if record_nodes else {})})
    return profile_frame(rows)


def test_both_levels_and_their_latencies_are_recovered():
    rows = rows_for((1, 2, 4, 8, 16), (64, 256, 1024))
    fitted = perf.fit(rows, form="additive", workers_per_node=G)
    assert fitted.sync_per_unit_s == pytest.approx(INTRA_BETA, rel=1e-6)
    assert fitted.sync_latency_s == pytest.approx(INTRA_ALPHA, rel=1e-6)
    assert fitted.inter_sync_per_unit_s == pytest.approx(INTER_BETA, rel=1e-6)
    assert fitted.inter_sync_latency_s == pytest.approx(INTER_ALPHA, rel=1e-6)
    for n in (2, 4, 8, 16):
        assert float(perf.predict_sync_s(fitted, n, 16)) == pytest.approx(
            true_sync(n, nodes_for(n, G)), rel=1e-6)


def test_a_one_node_cluster_size_is_predicted_from_the_node_level_alone():
    # Partial search's corners on 2 x 4: N = 1, 4 (one node) and 8 (two nodes).
    rows = rows_for((1, 4, 8), (64, 1024), inter_alpha=0.0, intra_alpha=0.0)
    fitted = perf.fit(rows, form="additive", workers_per_node=G)
    two = float(perf.predict_sync_s(fitted, 2, 32))
    assert two == pytest.approx(INTRA_BETA * 0.5, rel=1e-6)  # no network term in it
    flat = perf.fit(rows.drop(columns="num_nodes"), form="additive")  # no topology: one level
    flat_two = float(perf.predict_sync_s(flat, 2, 32))  # the network's cost leaks into it
    assert abs(flat_two / two - 1) > 0.1


def test_the_measured_num_nodes_wins_over_the_packed_guess():
    # The rows say N = 4 spanned two nodes (a placement Ray chose); the fit believes them.
    rows = rows_for((1, 2, 4), (64, 256), workers_per_node=2, inter_alpha=0.0, intra_alpha=0.0)
    fitted = perf.fit(rows, form="additive", workers_per_node=4)
    assert fitted.inter_sync_per_unit_s == pytest.approx(INTER_BETA, rel=1e-6)


def test_one_device_nodes_are_the_papers_single_level():
    rows = rows_for((1, 2, 4, 8), (64, 256), workers_per_node=1, inter_alpha=0.0,
                    intra_alpha=0.0)
    fitted = perf.fit(rows, form="additive", workers_per_node=1)
    for n in (2, 4, 8):  # every N > 1 crosses the network: beta_inter * (1 - 1/N)
        assert float(perf.predict_sync_s(fitted, n, 8)) == pytest.approx(
            INTER_BETA * (1 - 1 / n), rel=1e-6)


def test_without_rows_across_nodes_the_network_falls_back_and_says_so():
    rows = rows_for((1, 2, 4), (64, 256), intra_alpha=0.0)
    fitted = perf.fit(rows, form="additive", workers_per_node=G)
    assert fitted.inter_sync_per_unit_s is None
    assert any("no profile spans two nodes" in note for note in fitted.notes)
    # N = 8 on two nodes: the node's terms for both levels, stated, not silently 0.
    assert float(perf.predict_sync_s(fitted, 8, 8)) == pytest.approx(
        INTRA_BETA * (0.75 + 0.5), rel=1e-6)


def test_one_size_per_level_fits_no_latency():
    rows = rows_for((1, 4, 8), (64, 1024))
    fitted = perf.fit(rows, form="additive", workers_per_node=G)
    assert fitted.sync_latency_s == 0.0 and fitted.inter_sync_latency_s is None
    assert any("latency is folded" in note for note in fitted.notes)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 64), k=st.integers(1, 16))
def test_level_terms_reduce_to_the_papers_ring_on_one_node(n, k):
    one = sync_levels.level_terms("ring", n, 1)
    assert float(one.inter_units) == 0.0 and float(one.inter_hops) == 0.0
    assert float(one.intra_units) == pytest.approx(1 - 1 / n)
    k = min(k, n)
    terms = sync_levels.level_terms("ring", n, k)
    assert float(terms.inter_units) == pytest.approx(1 - 1 / k)
    assert float(terms.intra_units) == pytest.approx(1 - 1 / math.ceil(n / k))
    assert nodes_for(n, k) * k >= n


def test_a_collective_without_hops_has_no_latency_and_bad_hops_are_refused(monkeypatch):
    monkeypatch.setattr(sync_levels, "COLLECTIVES", dict(sync_levels.COLLECTIVES))
    monkeypatch.setattr(sync_levels, "COLLECTIVE_HOPS", dict(sync_levels.COLLECTIVE_HOPS))
    with pytest.raises(ValueError, match="hops\\(1\\) must be 0"):
        perf.register_collective("bad-hops", lambda n: 1 - 1 / np.asarray(n, float),
                                 hops=lambda n: np.asarray(n, float))
    assert float(sync_levels._hops("ps", 8)) == 0.0


def test_partial_search_profiles_the_largest_one_node_size_too():
    grid = [Candidate(n, b) for n in (1, 2, 4, 8) for b in (64, 256, 1024)]
    assert corner_sizes([1, 2, 4, 8], 4) == [1, 4, 8]
    assert corner_sizes([1, 2, 4, 8], 3) == [1, 2, 8]
    assert corner_sizes([1, 2, 4, 8], None) == [1, 8]
    strategy = make_search_strategy("partial", topology_options("partial", None, 4))
    proposed = strategy.propose(grid, profile_frame([])).candidates
    assert sorted({c.num_workers for c in proposed}) == [1, 4, 8]
    assert len(proposed) == 9  # smallest, middle and largest B at each
    assert topology_options("full", {}, 4) == {}  # full search takes no topology


def test_the_plan_records_the_topology_and_spans_nodes_in_its_table():
    space = SearchSpace.build((1, 2, 4, 8), min_batch=64, max_batch=1024)
    rows = rows_for((1, 4, 8), (64, 1024), inter_alpha=0.0, intra_alpha=0.0)
    plan = build_plan(space, rows, epochs=2, dataset_size=60000, search_strategy="partial",
                      workers_per_node=G)
    assert plan.meta["workers_per_node"] == G
    nodes = dict(zip(plan.table["num_workers"], plan.table["num_nodes"]))
    assert nodes == {1: 1, 2: 1, 4: 1, 8: 2}
    at_two = plan.table[(plan.table["num_workers"] == 2) & (plan.table["global_batch"] == 256)]
    predicted = float(at_two["sync_time_s"].iloc[0])
    assert predicted == pytest.approx(true_sync(2, 1, inter_alpha=0.0, intra_alpha=0.0),
                                      rel=1e-6)
    assert perf.PerfParams.from_dict(plan.perf.to_dict()) == plan.perf
    with pytest.raises(ValueError, match="workers_per_node"):
        build_plan(space, rows, epochs=2, dataset_size=60000, workers_per_node=0)


def test_old_params_without_topology_still_load():
    data = perf.PerfParams({}, perf.ComputeCurve(1e-3, 1e-4), 0.01, "ring").to_dict()
    for key in ("workers_per_node", "sync_latency_s", "inter_sync_per_unit_s",
                "inter_sync_latency_s"):
        data.pop(key)
    params = perf.PerfParams.from_dict(data)
    assert float(perf.predict_sync_s(params, 8, 0)) == pytest.approx(0.01 * 0.875)
