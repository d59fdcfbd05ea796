"""A search on an autoscaling cluster that starts with no worker nodes (issue 14, item 2).

Ray's fake multi-node autoscaler (`provider: fake_multinode`, started with
`RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=...`) launches local "nodes"
on demand. Its head has no CPU (like cluster.yaml's), and its only worker type, with
min_workers 0, offers a custom resource `accel` standing in for a GPU (a fake GPU
would make the workers use CUDA). The search must ask the autoscaler for its workers
(`resources_per_worker` names `accel`, issue 13 item 5), wait for them, and run on them;
too many workers for the config, or an autoscaler that does not deliver in time, is a
clear error.

Loopback only: Ray's local-only switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) binds the
head and the nodes its autoscaler starts to 127.0.0.1. The cluster has its own ports and
temp dir, and only the process tree this test started is stopped (never `ray stop`).
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray
import yaml
from ray.util.state import list_actors

from process_tree import kill_tree
from ray_budget import record_elsewhere

import tula_ray
from tula_ray.cluster import (AUTOSCALING_CONFIG_ENV, DRIVER_RESOURCE, LOCAL_NODE_IP,
                              ensure_ray, provision_workers)

pytestmark = [pytest.mark.ray, pytest.mark.own_ray]


def _gcs() -> str:
    """The connected cluster's address, for Ray's state API (which would otherwise pick
    among every Ray running on this machine)."""
    return ray.get_runtime_context().gcs_address

ACCEL = "accel"  # the stand-in for a GPU
WORKER = {"CPU": 1, ACCEL: 1}
MAX_WORKER_NODES = 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOCAL_NODE_IP, 0))
        return probe.getsockname()[1]


def _config(gcs_port: int) -> dict:
    """Ray's fake multi-node example config, cut to a CPU-less head and one worker type."""
    return {
        "cluster_name": "tula-fake", "max_workers": MAX_WORKER_NODES,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": f"{LOCAL_NODE_IP}:{gcs_port}"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0, DRIVER_RESOURCE: 4},
                                 "node_config": {}, "max_workers": 0},
            "worker": {"resources": WORKER, "node_config": {}, "min_workers": 0,
                       "max_workers": MAX_WORKER_NODES}},
        "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5, "docker": {}, "initialization_commands": [],
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [], "worker_start_ray_commands": [], "file_mounts": {},
        "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": []}


def _join(address: str, head: subprocess.Popen) -> None:
    """Connect once the head is up (`ray start --block` does not say when it is), as a
    driver on the head does: through tula-ray's join (a 127.0.0.1 cluster is loopback-only)."""
    while True:
        assert head.poll() is None, "ray start --head exited; see head.log in its temp dir"
        try:
            assert ensure_ray(address) is True
            return
        except ConnectionError:
            time.sleep(1)


@pytest.fixture(scope="module")
def fake_cluster(no_shared_ray):
    scratch = Path(tempfile.mkdtemp(prefix="tula-fake-"))
    port = _free_port()
    config = scratch / "autoscaling.yaml"
    config.write_text(yaml.safe_dump(_config(port)))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={port}",
         f"--autoscaling-config={config}", f"--temp-dir={scratch / 'ray'}",
         "--num-cpus=0", f"--resources={{\"{DRIVER_RESOURCE}\": 4}}",
         f"--dashboard-host={LOCAL_NODE_IP}", f"--dashboard-port={_free_port()}",
         "--disable-usage-stats"],
        env=env, stdout=open(scratch / "head.log", "w"), stderr=subprocess.STDOUT)
    saved = os.environ.get(AUTOSCALING_CONFIG_ENV)
    os.environ[AUTOSCALING_CONFIG_ENV] = str(config)  # where a driver on the head finds it
    try:
        _join(f"{LOCAL_NODE_IP}:{port}", head)
        assert [node["Resources"].get("CPU", 0) for node in ray.nodes()] == [0]
        yield scratch
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop(AUTOSCALING_CONFIG_ENV, None)
        else:
            os.environ[AUTOSCALING_CONFIG_ENV] = saved
        kill_tree(head.pid, grace_s=3)  # a fake cluster: nothing of it needs a clean end
        record_elsewhere(scratch / "ray", "the fake autoscaling cluster")
        shutil.rmtree(scratch, ignore_errors=True)


def test_more_workers_than_the_config_allows_is_refused_at_once(fake_cluster):
    with pytest.raises(ValueError, match=f"at most {MAX_WORKER_NODES} workers.*max_workers"):
        provision_workers(MAX_WORKER_NODES + 1, WORKER)


def test_an_autoscaler_that_does_not_deliver_in_time_is_a_clear_error(fake_cluster):
    with pytest.raises(TimeoutError, match="autoscaler.*ray status"):
        provision_workers(MAX_WORKER_NODES, WORKER, timeout_s=0)


def test_the_search_asks_the_autoscaler_for_its_workers(fake_cluster):
    plan = tula_ray.search(
        "fashion-mnist-cnn", workload_options={"train_subset": 512}, cluster_sizes=(2,),
        min_batch=32, max_batch=32, search_strategy="full", objective="time", warmup_steps=1,
        measure_steps=2, resources_per_worker=WORKER, provision_timeout_s=600,
        storage_path=str(fake_cluster / "runs"))
    assert list(plan.profiles["status"]) == ["ok"]
    nodes = [node for node in ray.nodes() if node["Alive"]]
    assert sorted(node["Resources"].get(ACCEL, 0) for node in nodes) == [0, 1, 1]
    workers = list_actors(address=_gcs(), filters=[("class_name", "=", "RayTrainWorker")],
                          detail=True)
    assert len(workers) == 2 and len({actor.node_id for actor in workers}) == 2
    for actor in workers:  # the workers hold what resources_per_worker asked for
        # (from their placement group's bundle: Ray names those "<resource>_group_<...>")
        held = {name.split("_group_")[0]: amount
                for name, amount in actor.required_resources.items()
                if not name.startswith("bundle_group_")}  # Ray's own marker of the bundle
        assert held == WORKER, actor.required_resources
    assert ray.is_initialized()  # the test's own connection is left alone
