"""Shared fixtures. Ray-marked tests start their own session per module (see tests/ray_session.py)."""

import os

# Ray's token auth makes the dashboard API answer 401 to our test clients; the
# product never changes this for its users, only the test process does.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray session per test module that asks for it, on loopback only."""
    import ray

    from tula_ray.cluster import DRIVER_RESOURCE, LOCAL_NODE_IP

    ray.init(address="local", num_cpus=2, _node_ip_address=LOCAL_NODE_IP, resources={DRIVER_RESOURCE: 4},
             include_dashboard=True, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
