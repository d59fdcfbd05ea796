"""The same search on a 2-node cluster (ray.cluster_utils.Cluster, loopback only):
N = 2 workers of one CPU each must land on both nodes and finish their DDP job."""

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

import tula_ray
from tula_ray.cluster import DRIVER_RESOURCE

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.3", "resources": {DRIVER_RESOURCE: 4},
        "include_dashboard": True})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.4")
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_two_workers_spread_over_two_nodes(two_nodes, tmp_path):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    plan = tula_ray.search("fashion-mnist-cnn", workload_options={"train_subset": 1024},
                           cluster_sizes=(2,), min_batch=32, max_batch=32, mode="partial",
                           objective="time", warmup_steps=1, measure_steps=3,
                           storage_path=str(tmp_path))
    row = plan.chosen
    # Ran to the end as one 2-worker DDP job (gloo needs both ranks). Its sync time is
    # not asserted: at b = 16 over 3 steps it is within timing noise of 0 (CI saw 0.0).
    assert row["status"] == "ok" and row["measured_step_time_s"] > 0
    workers = list_actors(filters=[("class_name", "=", "RayTrainWorker")], detail=True)
    assert len(workers) == 2
    assert len({actor.node_id for actor in workers}) == 2
    assert ray.is_initialized()  # the user's ray.init(address=...) was respected, not shut down
