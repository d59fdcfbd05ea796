"""A node of a running cluster lost in the middle of a search (issue 13, item 3).

A 2-node `ray.cluster_utils.Cluster` (one CPU each, loopback only); a full search over
N in {1, 2} with a Workload defined here. As soon as the N = 1 worker group has reported
its last batch, the second node is removed (its raylet and workers die). The N = 2
candidates cannot run any more: they become error rows that say why and how to go on,
after a short wait for the node to come back, and the search finishes on what is left.
"""

import sys
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from ray import cloudpickle
from ray.cluster_utils import Cluster
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray.cluster import DRIVER_RESOURCE
from tula_ray.workloads import Workload

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

BATCHES = (32, 64)


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.rand((512, 1, 8, 8), generator=generator),
                         torch.randint(0, 4, (512,), generator=generator))


def model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.5", include_dashboard=False,
                         resources={DRIVER_RESOURCE: 4})
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.6")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _remove_the_second_node_after_n1(cluster, storage: Path, removed: list,
                                     stop: threading.Event) -> None:
    node = cluster.list_all_nodes()[1]
    while not stop.is_set():
        results = list(storage.glob("*/profile_N1_*/result.json"))
        # Its rows, then the launch's own result once the group ended: one more line.
        if results and len(results[0].read_text().strip().splitlines()) > len(BATCHES):
            cluster.remove_node(node)  # kills its raylet and every worker on it
            removed.append(time.monotonic())
            return
        time.sleep(0.1)


def test_a_search_finishes_on_what_is_left_when_a_node_is_lost(cluster, tmp_path):
    removed, stop = [], threading.Event()
    remover = threading.Thread(target=_remove_the_second_node_after_n1,
                               args=(cluster, tmp_path, removed, stop))
    remover.start()
    try:
        plan = tula_ray.search(Workload("node-loss-mlp", model, data), strategy="full",
                               cluster_sizes=(1, 2), min_batch=BATCHES[0], max_batch=BATCHES[-1],
                               warmup_steps=1, measure_steps=3, measure_seconds=0.2,
                               objective="time", storage_path=str(tmp_path),
                               provision_timeout_s=5.0)
    finally:
        stop.set()
        remover.join()
    assert removed, "the N = 1 sweep never finished"
    rows = plan.profiles.set_index(["num_workers", "global_batch"])
    assert (rows.loc[1, "status"] == "ok").all() and len(rows.loc[1]) == len(BATCHES)
    lost = rows.loc[2]
    assert len(lost) == len(BATCHES) and (lost["status"] == "error").all()
    assert plan.choice.num_workers == 1  # chosen among what was measured
    table = plan.table.set_index(["num_workers", "global_batch"])
    assert not table.loc[2, "feasible"].any()
