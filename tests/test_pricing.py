from dataclasses import dataclass

import numpy as np
import pytest

from tula_ray.models import pricing as pricing_module
from tula_ray.models.pricing import (OLD_COST_SIGNATURE_REMOVED_IN, FixedRate, MemoryRate,
                                     NodeBilling, PerSecondBilling, Pricing, parse_pricing,
                                     pricing_from_dict, pricing_to_dict, register_pricing)


def test_fixed_rate_eq_4b():
    assert FixedRate(2.48).cost_usd(3600.0, 2, None) == pytest.approx(4.96)
    costs = FixedRate().cost_usd(np.array([1800.0, 3600.0]), np.array([[1], [4]]), None)
    np.testing.assert_allclose(costs, [[1.24, 2.48], [4.96, 9.92]])


@pytest.mark.parametrize("pricing", [FixedRate(3600.0), PerSecondBilling(3600.0, minimum_s=0)])
def test_a_node_is_billed_whole(pricing):
    # 1 $ per node-second, one second: N workers on nodes of G = 4 pay ceil(N / 4) nodes
    workers = np.array([1, 2, 3, 4, 5, 8])
    np.testing.assert_allclose(pricing.cost_usd(1.0, workers, None, workers_per_node=4),
                               [1, 1, 1, 1, 2, 2])
    # G = 1 or unknown: a node per worker, as before G was known
    for per_node in (1, None):
        np.testing.assert_allclose(pricing.cost_usd(1.0, workers, None, workers_per_node=per_node),
                                   workers)
    np.testing.assert_allclose(pricing.cost_usd(1.0, workers, None), workers)


@pytest.mark.parametrize("kind", [FixedRate, PerSecondBilling])
def test_shared_nodes_bill_each_worker_its_share(kind):
    shared = kind(3600.0, shared_nodes=True)
    if kind is PerSecondBilling:
        shared = kind(3600.0, minimum_s=0, shared_nodes=True)
    np.testing.assert_allclose(shared.cost_usd(1.0, np.array([1, 3, 8]), None, workers_per_node=4),
                               [0.25, 0.75, 2.0])


def test_memory_rate_bills_memory_used_whatever_the_nodes():
    assert MemoryRate(0.15).cost_usd(3600.0, 2, 4e9, workers_per_node=4) == pytest.approx(1.2)


def test_a_pricing_without_workers_per_node_is_called_without_it_and_warned_once():
    class Old:  # written to the signature before G
        def cost_usd(self, time_s, num_workers, peak_mem_bytes):
            return np.asarray(time_s, float) * np.asarray(num_workers, float)

    class Flexible:  # **kwargs takes G too
        def cost_usd(self, time_s, num_workers, peak_mem_bytes, **options):
            return options["workers_per_node"] * np.ones(np.shape(num_workers))

    with pytest.warns(FutureWarning) as caught:
        first = NodeBilling(Old(), 4).cost_usd(2.0, np.array([1, 4]), None)
        again = NodeBilling(Old(), 8).cost_usd(2.0, np.array([1, 4]), None)
    np.testing.assert_allclose([first, again], [[2.0, 8.0], [2.0, 8.0]])
    message, = [str(w.message) for w in caught]  # one warning per class, not per call
    assert "workers_per_node" in message and OLD_COST_SIGNATURE_REMOVED_IN in message
    assert "Old.cost_usd" in message
    assert NodeBilling(Flexible(), 4).cost_usd(1.0, [1, 2], None).tolist() == [4, 4]
    # the built-ins take G: a plan in whole nodes
    assert NodeBilling(FixedRate(3600.0), 4).cost_usd(1.0, 3, None) == pytest.approx(1.0)


def test_memory_rate_charges_memory_used():
    # 2 nodes x 1 h x 4 GB x 0.15 $/GB-h
    assert MemoryRate(0.15).cost_usd(3600.0, 2, 4e9) == pytest.approx(1.2)


def test_per_second_billing_rounds_up_with_a_minimum():
    billing = PerSecondBilling(3600.0, minimum_s=60)  # 1 $ per node-second
    np.testing.assert_allclose(billing.cost_usd(np.array([0.2, 90.1]), 2), [120.0, 182.0])


@dataclass(frozen=True)
class Spot:
    usd_per_node_hour: float
    discount: float

    def cost_usd(self, time_s, num_workers, peak_mem_bytes=None):
        return FixedRate(self.usd_per_node_hour).cost_usd(time_s, num_workers) * (1 - self.discount)

    def to_dict(self):
        return {"kind": "spot-test", "usd_per_node_hour": self.usd_per_node_hour,
                "discount": self.discount}


@pytest.fixture
def spot_registered(monkeypatch):
    """Spot registered for one test only: the registry is restored afterwards."""
    monkeypatch.setattr(pricing_module, "PRICINGS", dict(pricing_module.PRICINGS))
    register_pricing("spot-test", Spot)


@pytest.mark.parametrize("pricing", [FixedRate(1.0), MemoryRate(0.2), PerSecondBilling(3.0, 10.0),
                                     Spot(2.48, 0.7)])
def test_round_trip_through_dicts(pricing, spot_registered):
    assert isinstance(pricing, Pricing)
    assert pricing_from_dict(pricing_to_dict(pricing)) == pricing


def test_parse_pricing_forms_and_errors():
    assert parse_pricing("fixed") == FixedRate()
    assert parse_pricing("fixed:3.5") == FixedRate(3.5)
    assert parse_pricing("memory:0.2") == MemoryRate(0.2)
    assert parse_pricing({"kind": "memory", "usd_per_gb_hour": 0.1}) == MemoryRate(0.1)
    assert parse_pricing("fixed:3.5:shared") == FixedRate(3.5, shared_nodes=True)
    assert parse_pricing("per-second:shared") == PerSecondBilling(shared_nodes=True)
    # a plan saved before shared_nodes: its nodes were billed whole, the default
    assert pricing_from_dict({"kind": "fixed", "usd_per_node_hour": 2.0}) == FixedRate(2.0)
    with pytest.raises(ValueError, match="'memory' has no shared_nodes option"):
        parse_pricing("memory:0.2:shared")
    with pytest.raises(ValueError, match="pricing 'fixed:1:2' is not understood"):
        parse_pricing("fixed:1:2")
    with pytest.raises(ValueError, match="pricing 'hourly' is not understood"):
        parse_pricing("hourly")
    with pytest.raises(ValueError, match="usd_per_node_hour=-1.0"):
        parse_pricing("fixed:-1")
    with pytest.raises(ValueError, match="pricing kind 'moon' is not registered"):
        pricing_from_dict({"kind": "moon"})


def test_a_registered_kind_is_gone_after_the_test_that_registered_it():
    assert "spot-test" not in pricing_module.PRICINGS
    with pytest.raises(ValueError, match="pricing kind 'spot-test' is not registered"):
        pricing_from_dict(Spot(2.48, 0.7).to_dict())
