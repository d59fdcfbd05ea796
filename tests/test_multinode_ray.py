"""tula-ray on a running 2-node cluster (ray.cluster_utils.Cluster, loopback only).

A user's driver script (examples/cluster_driver.py: its own model and data), run as
a subprocess that is told the cluster only through RAY_ADDRESS, must join that cluster
(issue 14, item 1) rather than start a Ray of its own, and its N = 2 workers must land
on both nodes and finish their DDP job. On a multi-node cluster a search or a training
without a storage path every node reaches is refused before anything runs (issue 14,
item 4: Train V2 would keep the run's files on the driver's node). Topology (issue 26,
item 1): each node holds 4 of a custom resource standing in for GPUs; a search over
N = 1, 2, 4, 8 places N = 4 on one node and N = 8 on two, and plans N = 2 from the
node's own sync level. It checks placement and labelling, not the network.
"""

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch
from ray import cloudpickle  # Ray serialises functions with its own copy
from ray.cluster_utils import Cluster
from ray.util.state import list_actors, list_jobs
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray import SearchSpace, build_plan
from tula_ray.cluster import ADDRESS_ENV, DRIVER_RESOURCE
from tula_ray.models import perf
from tula_ray.planning.plan import Plan
from tula_ray.planning.synthetic import example_params, synthetic_profiles
from tula_ray.workloads import Workload

pytestmark = pytest.mark.ray

# Ray workers cannot import this test module: its functions travel by value, as a
# driver script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _gcs() -> str:
    """The connected cluster's address, for Ray's state API (which would otherwise pick
    among every Ray running on this machine)."""
    return ray.get_runtime_context().gcs_address

DRIVER = Path(__file__).parents[1] / "examples" / "cluster_driver.py"
STAND_IN_GPU, GPUS_PER_NODE = "stand_in_gpu", 4


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster()  # nodes added inside `try`, so a failed start is still shut down
    try:
        # Its own dashboard port: 8265 may be taken by another Ray on this machine.
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.3", include_dashboard=True,
                         dashboard_host="127.0.0.3", dashboard_port=_free_port("127.0.0.3"),
                         resources={DRIVER_RESOURCE: 4, STAND_IN_GPU: GPUS_PER_NODE})
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.4",
                         resources={STAND_IN_GPU: GPUS_PER_NODE})
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def driver_run(two_nodes, tmp_path_factory):
    """The driver script, as a user runs it, with RAY_ADDRESS naming the cluster."""
    scratch = tmp_path_factory.mktemp("driver")
    completed = subprocess.run(
        [sys.executable, str(DRIVER), "--storage-path", str(scratch / "runs"),
         "--name", "joined", "--out", str(scratch / "plan")],
        env={**os.environ, ADDRESS_ENV: two_nodes.address}, capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return Plan.from_json(scratch / "plan" / "plan.json")


@pytest.fixture(scope="module")
def connected(two_nodes):
    """This test process joins the cluster too, as a user's own `ray.init` would."""
    ray.init(address=two_nodes.address)
    return two_nodes


def test_the_driver_joins_the_cluster_named_by_ray_address(driver_run, connected):
    assert driver_run.workload == "tiny-mlp"
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    # The driver's job is one of THIS cluster's jobs: it did not start a Ray of its own.
    drivers = [job for job in list_jobs(address=_gcs(), detail=True)
               if job.type == "DRIVER" and str(DRIVER.name) in (job.entrypoint or "")]
    assert len(drivers) == 1 and drivers[0].status == "SUCCEEDED"


def test_two_workers_spread_over_two_nodes(driver_run, connected):
    rows = driver_run.profiles
    assert list(zip(rows["num_workers"], rows["status"])) == [(2, "ok")]
    # Ran to the end as one 2-worker DDP job (gloo needs both ranks). Its sync time is
    # not asserted: at b = 16 over 2 steps it is within timing noise of 0.
    assert rows["step_time_s"].iloc[0] > 0
    workers = list_actors(address=_gcs(), filters=[("class_name", "=", "RayTrainWorker")],
                          detail=True)
    assert len(workers) == 2
    assert len({actor.node_id for actor in workers}) == 2


def _train_workers() -> int:
    return len(list_actors(address=_gcs(), filters=[("class_name", "=", "RayTrainWorker")]))


def test_multi_node_without_shared_storage_is_refused_before_anything_runs(connected):
    workers_before = _train_workers()
    with pytest.raises(ValueError, match="2 nodes and storage_path is None.*shared file system"
                                         ".*cloud URI"):
        tula_ray.search("fashion-mnist-cnn", workload_options={"train_subset": 256},
                        cluster_sizes=(2,), min_batch=32, max_batch=32)
    space = SearchSpace((2,), (32, 64))
    plan = build_plan(space, synthetic_profiles(space.candidates(), example_params()),
                      epochs=1, dataset_size=1024, strategy="full", objective="time",
                      workload="fashion-mnist-cnn",
                      meta={"workload_options": {"train_subset": 1024}})
    with pytest.raises(ValueError, match="2 nodes and storage_path is None"):
        tula_ray.train(plan, "lbt")
    assert _train_workers() == workers_before  # no training worker was started
    assert ray.is_initialized()  # the user's ray.init(address=...) was respected, not shut down


def _tiny_data(train: bool) -> TensorDataset:
    generator = torch.Generator().manual_seed(0 if train else 1)
    inputs = torch.randn(512 if train else 64, 1, 8, 8, generator=generator)
    return TensorDataset(inputs, (inputs.mean(dim=(1, 2, 3)) > 0).long())


def _tiny_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 2))


def test_one_node_sizes_stay_on_one_node_and_are_planned_from_its_level(connected, tmp_path):
    workload = Workload(name="user-topology", model_fn=_tiny_model,
                        train_dataset_fn=lambda: _tiny_data(True),
                        test_dataset_fn=lambda: _tiny_data(False), epochs=1, num_classes=2)
    plan = tula_ray.search(
        workload, cluster_sizes=(1, 2, 4, 8), min_batch=16, max_batch=64, strategy="partial",
        objective="time", warmup_steps=1, measure_steps=2, measure_seconds=0.2,
        resources_per_worker={"CPU": 0.25, STAND_IN_GPU: 1}, storage_path=str(tmp_path),
        name="topology", address=connected.address)
    rows = plan.profiles[plan.profiles["status"] == "ok"]
    # partial search's corners per topology: the largest one-node N (4) and the largest (8)
    assert sorted(set(rows["num_workers"])) == [1, 4, 8]
    nodes = dict(zip(rows["num_workers"], rows["num_nodes"]))
    assert nodes == {1: 1, 4: 1, 8: 2}  # STRICT_PACK kept N = 4 on one node
    assert plan.meta["workers_per_node"] == GPUS_PER_NODE
    at_two = plan.table[plan.table["num_workers"] == 2]
    assert set(at_two["num_nodes"]) == {1}
    # N = 2's predicted sync is the node level's alone: the network's terms do not move it.
    network = dataclasses.replace(plan.perf, inter_sync_per_unit_s=1.0, inter_sync_latency_s=1.0)
    for b in at_two["local_batch"]:
        assert perf.predict_sync_s(network, 2, b) == perf.predict_sync_s(plan.perf, 2, b)
        assert perf.predict_sync_s(network, 8, b) > perf.predict_sync_s(plan.perf, 8, b)
