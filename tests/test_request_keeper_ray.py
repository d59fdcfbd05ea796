"""The autoscaler request outlives its driver by at most a minute (issue 45, item 3).

A driver joins the run's shared Ray, asks for workers through `request_workers` (as
`provision_workers` does on an autoscaling cluster), and is killed with SIGKILL: no
`finally` runs. Its keeper must withdraw the request within 60 s, and end. A local Ray has
no autoscaler, but the request is the same record in the GCS that an autoscaler reads (the
v1 autoscaler's key in the internal KV, which `ray.autoscaler.sdk.request_resources`
writes), so the test reads that. No worker group is launched: the keeper is one actor.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import ray
from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
from ray.autoscaler.v2.utils import is_autoscaler_v2
from ray.experimental.internal_kv import _internal_kv_get

from tula_ray.cluster.requests import BEAT_S, WATCH_POLL_S
from tula_ray.cluster import KEEPER_NAMESPACE, STALE_S, release_workers, request_workers
from tula_ray.cluster.workers import Workers

pytestmark = pytest.mark.ray

BUNDLES = [{"CPU": 1.0}, {"CPU": 1.0}]
# The driver's keeper waits this long for a missed beat, not STALE_S (30 s): the same
# mechanism, 18 s less of the suite spent waiting. That STALE_S itself withdraws within
# the minute is `test_the_keepers_staleness_withdraws_within_a_minute`.
TEST_STALE_S = 12.0
DRIVER = """
import sys, time
from tula_ray.cluster import driver_keeper, ensure_ray, keeper_name, request_workers
ensure_ray(sys.argv[1])  # as a user's driver joins a cluster
driver_keeper(stale_s={stale_s})  # started here, found by name by request_workers
request_workers({bundles!r})
print("keeper:", keeper_name(), flush=True)
time.sleep(600)
"""


def outstanding_request() -> list[dict[str, float]]:
    """The cluster's autoscaler request, as the v1 autoscaler reads it."""
    assert not is_autoscaler_v2(), "this Ray runs autoscaler v2: read its constraints"
    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


def _keeper_named_by(driver: subprocess.Popen) -> str:
    """The keeper's name, once the driver says its request is held (Ray prints first)."""
    for line in driver.stdout:
        if line.startswith("keeper: "):
            return line.split()[1]
    raise AssertionError(f"the driver ended ({driver.wait()}) before holding its request")


def _keeper_alive(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=KEEPER_NAMESPACE)
    except ValueError:
        return False
    return True


def test_a_killed_drivers_request_is_withdrawn_within_a_minute(ray_session):
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(bundles=BUNDLES, stale_s=TEST_STALE_S), ray_session],
        stdout=subprocess.PIPE, text=True)
    try:
        name = _keeper_named_by(driver)
        keeper = ray.get_actor(name, namespace=KEEPER_NAMESPACE)
        assert outstanding_request() == BUNDLES
        time.sleep(BEAT_S + 1)  # a beat arrives: the keeper leaves a live driver's alone
        # (its own record: the cluster's is one key that others write too, e.g. Ray Data's
        # AutoscalingRequester purging its expired requests, ray-project/ray#13534)
        assert ray.get(keeper.held.remote()) == BUNDLES
        os.kill(driver.pid, signal.SIGKILL)
        killed = time.monotonic()
        while _keeper_alive(name):  # it withdraws the request, then ends
            assert time.monotonic() - killed < 60, "the keeper outlived its driver by 60 s"
            time.sleep(0.5)
        assert time.monotonic() - killed >= TEST_STALE_S - BEAT_S  # it waited for missed beats
        assert outstanding_request() == []
    finally:
        driver.kill()
        driver.wait()


def test_the_keepers_staleness_withdraws_within_a_minute():
    assert BEAT_S + 1 < TEST_STALE_S  # the test's beat check above waits one beat
    assert STALE_S + WATCH_POLL_S < 60  # the product's keeper, after its driver's last beat


def test_a_drivers_release_withdraws_at_once(ray_session):
    request_workers(BUNDLES)
    assert outstanding_request() == BUNDLES
    release_workers(Workers({"CPU": 1.0}, False, requested=True))
    assert outstanding_request() == []
