"""The suite's guard against a test that leaves the shared Ray's CPUs taken
(tests/ray_leftovers.py, conftest's `ray_leftovers`): what holds them is named, and
freed, so the next test can start."""

import sys

import pytest
import ray
from ray import cloudpickle
from ray.util.placement_group import placement_group

from ray_leftovers import cpus_back, release_leftovers

pytestmark = pytest.mark.ray
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Holder:
    """Stands for a worker that outlived its test."""

    def ready(self) -> bool:
        return True


def test_an_actor_and_a_placement_group_left_behind_are_named_and_freed(ray_session):
    assert release_leftovers(wait_s=5) == []  # the tests before this one left nothing
    actor = ray.remote(num_cpus=1)(Holder).remote()
    ray.get(actor.ready.remote())
    group = placement_group([{"CPU": 1}], name="left-by-a-test")
    ray.get(group.ready())
    assert not cpus_back(wait_s=0.5)
    held = release_leftovers(wait_s=0.5)
    assert len(held) == 2 and held[0].startswith("actor Holder (pid ")
    assert held[1].startswith("placement group left-by-a-test ([")
    assert cpus_back(wait_s=30)
