"""Worker resources, capacity and storage rules of tula_ray.cluster, without a Ray session
(issue 13 item 5; issue 14 items 2 and 4)."""

import os
from pathlib import Path

import pytest
import ray

import tula_ray
from tula_ray import cluster
from tula_ray.cluster import storage, workers
from tula_ray.cluster import (CPU_WORKER, GPU_WORKER, autoscaler_node_types, gpu_worker,
                              check_resources_per_worker, check_worker_request, worker_shape,
                              workers_that_fit)

CLUSTER_YAML = Path(__file__).parents[1] / "cluster.yaml"


@pytest.mark.parametrize("resources", [
    {}, {"CPU": 0}, {"CPU": -1}, {"CPU": float("nan")}, {"CPU": float("inf")}, {"GPU": 1.5},
    {"": 1}, {"CPU": 0.00001}])
def test_bad_worker_resources_are_named(resources):
    with pytest.raises(ValueError, match="resources_per_worker"):
        check_resources_per_worker(resources)


@pytest.mark.parametrize("resources, message", [
    ([("CPU", 4)], r"resources_per_worker=\[\('CPU', 4\)\]; it must be a dict"),
    ({"CPU": True}, r"resources_per_worker\['CPU'\]=True; it must be a number"),
    ({"CPU": "4"}, r"resources_per_worker\['CPU'\]='4'; it must be a number"),
    ({1: 2}, "resources_per_worker has the key 1; keys must be strings")])
def test_worker_resources_of_the_wrong_type_are_named(resources, message):
    with pytest.raises(TypeError, match=message):
        check_resources_per_worker(resources)


def test_worker_resources_as_ray_takes_them():
    assert check_resources_per_worker(None) is None
    assert check_resources_per_worker({"CPU": 4, "GPU": 0.5, "accel": 2}) == {
        "CPU": 4.0, "GPU": 0.5, "accel": 2.0}
    assert check_resources_per_worker({"GPU": 2}) == {"GPU": 2.0}


@pytest.mark.parametrize("resources, timeout_s, use_gpu, error, message", [
    ({"CPU": 2}, -1, None, ValueError, r"provision_timeout_s=-1.0; .* \[0.0, inf\] \(seconds"),
    ({"CPU": 2}, "soon", None, TypeError, "provision_timeout_s='soon'; it must be a number"),
    ({"CPU": 2}, 10, True, ValueError, "use_gpu=True contradicts"),
    ({"CPU": 1, "GPU": 1}, 10, False, ValueError, "use_gpu=False contradicts")])
def test_worker_request_is_checked(resources, timeout_s, use_gpu, error, message):
    with pytest.raises(error, match=message):
        check_worker_request(resources, timeout_s, use_gpu)
    assert check_worker_request(resources, float("inf"), None) == {  # no time limit
        name: float(amount) for name, amount in resources.items()}


def test_bad_worker_resources_fail_before_ray_starts(tmp_path):
    for call in (lambda: tula_ray.search("fashion-mnist-cnn", resources_per_worker={"CPU": 0},
                                         workload_options={"train_subset": 256}),
                 lambda: tula_ray.search("fashion-mnist-cnn", address="",
                                         workload_options={"train_subset": 256})):
        with pytest.raises(ValueError, match="resources_per_worker|address"):
            call()
    assert not ray.is_initialized()


def test_workers_fit_per_node_not_in_sum():
    # Hand counts: a worker lives on one node, so 2 nodes of 3 CPUs hold two 2-CPU workers.
    assert workers_that_fit({"CPU": 2.0}, [{"CPU": 3.0}, {"CPU": 3.0}]) == 2
    assert workers_that_fit(GPU_WORKER, [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 0.0}]) == 1
    assert workers_that_fit(GPU_WORKER, [{"CPU": 8.0, "GPU": 4.0}]) == 4
    assert workers_that_fit({"CPU": 1.0, "accel": 1.0}, [{"CPU": 4.0}]) == 0
    assert workers_that_fit({"CPU": 0.5}, [{"CPU": 2.0}]) == 4


def test_cluster_yaml_workers_are_gpus_the_autoscaler_can_add(monkeypatch):
    types = autoscaler_node_types(str(CLUSTER_YAML))
    # the head type is not a worker type
    assert types == [({"CPU": 8.0, "GPU": 1.0}, 16), ({"CPU": 48.0, "GPU": 4.0}, 4)]
    # Before any GPU node is up (min_workers 0) the default worker is still a GPU one.
    monkeypatch.setattr(workers.ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(workers, "autoscaler_node_types", lambda: types)
    # the autoscaler can add GPU nodes; a worker takes its node's CPUs per GPU, the fewest
    # of the two types' (8 / 1 and 48 / 4), so that it fits on either (issue 45, item 5)
    assert worker_shape() == {"CPU": 8.0, "GPU": 1.0}
    monkeypatch.setattr(workers, "autoscaler_node_types", lambda: None)
    assert worker_shape() == CPU_WORKER
    monkeypatch.setattr(workers.ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 2.0})
    assert worker_shape() == GPU_WORKER  # no GPU node's shape known (no Ray here): one CPU
    assert worker_shape(use_gpu=False) == CPU_WORKER and worker_shape({"CPU": 2}) == {"CPU": 2}
    assert autoscaler_node_types(str(CLUSTER_YAML.with_name("no-such.yaml"))) is None


@pytest.mark.parametrize("nodes, cpus", [
    ([{"CPU": 4.0, "GPU": 1.0}], 4.0),                          # g5.xlarge: the whole node
    ([{"CPU": 48.0, "GPU": 4.0}], 12.0),                        # g5.12xlarge: a quarter
    ([{"CPU": 96.0, "GPU": 8.0}, {"CPU": 4.0, "GPU": 1.0}], 4.0),  # fits on both
    ([{"CPU": 2.0, "GPU": 4.0}], 1.0),                          # at least one
    ([{"CPU": 8.0}], 1.0),                                      # no GPU node known
])
def test_a_gpu_worker_takes_its_nodes_cpus_per_gpu(nodes, cpus):
    assert gpu_worker(nodes) == {"CPU": cpus, "GPU": 1.0}


def _nodes(count):
    return [{"Alive": True, "NodeID": f"{i:056x}", "NodeManagerAddress": f"127.0.0.{i + 3}",
             "Resources": {"CPU": 1.0}} for i in range(count)]


def test_multi_node_storage_rules(monkeypatch, tmp_path):
    monkeypatch.setattr(storage.ray, "nodes", lambda: _nodes(2))
    with pytest.raises(ValueError, match="2 nodes and storage_path is None.*shared file system"
                                         ".*cloud URI"):
        cluster.check_storage_path(None)
    # A cloud URI is written and read back on every node (a task each: faked here).
    asked = []
    monkeypatch.setattr(storage, "nodes_not_writing",
                        lambda uri, nodes, fs: asked.append((uri, len(nodes))) or {})
    cluster.check_storage_path("s3://bucket/runs")
    assert asked == [("s3://bucket/runs", 2)]
    monkeypatch.setattr(storage, "nodes_not_writing", lambda uri, nodes, fs: {
        "127.0.0.4": "OSError: AWS Error ACCESS_DENIED during PutObject operation"})
    with pytest.raises(ValueError, match=r"s3://bucket/runs' cannot be written from the nodes "
                                         r"at 127.0.0.4 \(127.0.0.4: OSError: AWS Error "
                                         r"ACCESS_DENIED.*"
                                         r"instance profile"):
        cluster.check_storage_path("s3://bucket/runs")
    # A local path is asked of every node; one that does not see the driver's file is named.
    monkeypatch.setattr(storage, "nodes_not_seeing", lambda path, nodes: ["127.0.0.4"])
    with pytest.raises(ValueError, match="not visible from the nodes at 127.0.0.4"):
        cluster.check_storage_path(str(tmp_path))
    monkeypatch.setattr(storage, "nodes_not_seeing", lambda path, nodes: [])
    cluster.check_storage_path(str(tmp_path))
    monkeypatch.setattr(storage.ray, "nodes", lambda: _nodes(1))
    cluster.check_storage_path(None)  # one node: its own disk is every node's


def test_a_store_is_written_and_read_back_through_pyarrow(tmp_path):
    """What each node's task does (`write_and_read`): a file:// URI here; an unwritable
    place is named by its error, and no marker is left behind."""
    assert storage.write_and_read(f"file://{tmp_path}/runs") is None
    assert list((tmp_path / "runs").iterdir()) == []
    (tmp_path / "locked").mkdir(mode=0o500)
    error = storage.write_and_read(f"file://{tmp_path}/locked/runs")
    if os.geteuid() != 0:  # root writes anywhere
        assert error is not None and "Permission denied" in error


def test_train_launches_poll_their_workers_promptly_unless_the_user_said(monkeypatch):
    """Ray Train's controller polls every 2 s by default: each launch waits for it at its
    end, and at each report that comes sooner (benchmarks/startup/launch_overhead.py)."""
    from ray.train.v2._internal.constants import (ENV_VARS_TO_PROPAGATE,
                                                  HEALTH_CHECK_INTERVAL_S_ENV_VAR)

    # the variable Ray reads, and passes on from `fit()`'s process to the controller
    assert cluster.TRAIN_POLL_ENV == HEALTH_CHECK_INTERVAL_S_ENV_VAR
    assert cluster.TRAIN_POLL_ENV in ENV_VARS_TO_PROPAGATE
    monkeypatch.delenv(cluster.TRAIN_POLL_ENV, raising=False)
    cluster.prompt_train_polls()
    assert os.environ[cluster.TRAIN_POLL_ENV] == str(cluster.TRAIN_POLL_S) == "0.25"
    monkeypatch.setenv(cluster.TRAIN_POLL_ENV, "3")
    cluster.prompt_train_polls()
    assert os.environ[cluster.TRAIN_POLL_ENV] == "3"  # the user's own value is kept
