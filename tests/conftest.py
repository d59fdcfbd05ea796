"""Shared fixtures. Ray-marked tests start their own session per module (`ray_session`)."""

import os
import sys

# Ray's token auth makes the dashboard API answer 401 to our test clients; the
# product never changes this for its users, only the test process does.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray session per test module that asks for it, on loopback only: the
    product's own local start (tula_ray.cluster.start_local_ray) with 2 CPUs, so no test
    depends on the machine's core count."""
    import ray

    from tula_ray.cluster import start_local_ray

    start_local_ray(num_cpus=2)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def registries():
    """Every registry as it was before the test afterwards, and the extension modules
    forgotten, so that each test adds its extension itself."""
    from tula_ray.models import compute_forms, pricing
    from tula_ray.planning import search_strategies
    from tula_ray.training import strategies
    from tula_ray.workloads import workload

    saved = [(registry, dict(registry)) for registry in (
        search_strategies.SEARCH_STRATEGIES, strategies.TRAINING_STRATEGIES, pricing.PRICINGS,
        compute_forms.COMPUTE_FORMS, workload.WORKLOADS)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)
    from extension_registries import FILES

    for name in FILES:
        sys.modules.pop(name, None)
