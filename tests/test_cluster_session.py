"""No silent local Ray beside a running cluster (issue 26 item 6), without a Ray session:
Ray's record of a running Ray (its temp dir's ray_current_cluster) is written by the test,
a plain TCP listener stands in for that Ray's GCS, and starting or joining Ray is recorded
instead of done."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import ray

from tula_ray.cluster import (ADDRESS_ENV, AUTOSCALING_CONFIG_ENV, CPU_WORKER, ensure_ray,
                              joined_node_types, running_ray_address, started_ray_here,
                              worker_shape)
from tula_ray.cluster import session, workers

CLUSTER_YAML = Path(__file__).parents[1] / "cluster.yaml"


@pytest.fixture
def ray_calls(monkeypatch, tmp_path):
    """Ray's temp dir in tmp_path, no $RAY_ADDRESS, and what ensure_ray starts or joins
    recorded (nothing is started)."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    calls = []
    monkeypatch.setattr(session, "start_local_ray", lambda **kw: calls.append("local"))
    monkeypatch.setattr(session.ray, "init", lambda address, **kw: calls.append(address))
    monkeypatch.setattr(session.ray, "nodes", lambda: [])
    assert not ray.is_initialized()
    return calls


def _record(tmp_path: Path, address: str) -> None:
    """What `ray start --head` writes (and `ray stop` removes) in Ray's temp dir."""
    (tmp_path / "ray").mkdir(exist_ok=True)
    (tmp_path / "ray" / "ray_current_cluster").write_text(address)


@pytest.fixture
def running_head(tmp_path):
    """A recorded Ray whose GCS port accepts connections (a listener on loopback)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    _record(tmp_path, address)
    try:
        yield address
    finally:
        listener.close()


def test_no_address_beside_a_running_ray_is_refused_at_once(ray_calls, running_head):
    assert running_ray_address() == running_head
    with pytest.raises(ValueError) as info:
        ensure_ray()
    message = str(info.value)
    assert running_head in message
    assert "--address auto" in message and "address='auto'" in message
    assert "--address local" in message and "address='local'" in message
    assert ray_calls == []  # nothing started, nothing joined


def test_an_explicit_address_is_used_beside_a_running_ray(ray_calls, running_head,
                                                          monkeypatch):
    assert ensure_ray("local") is True  # the user asked for a separate local Ray
    assert ensure_ray("auto") is True  # ... or for the running one
    monkeypatch.setenv(ADDRESS_ENV, running_head)  # `ray job submit` names it
    assert ensure_ray() is True
    assert ray_calls == ["local", "auto", running_head]


def test_a_stale_record_or_none_starts_a_local_ray(ray_calls, tmp_path):
    assert running_ray_address() is None  # no record: a laptop
    assert ensure_ray() is True
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nobody listens on: a Ray that died
    _record(tmp_path, f"127.0.0.1:{closed.getsockname()[1]}")
    try:
        assert running_ray_address() is None
        assert ensure_ray() is True
    finally:
        closed.close()
    assert ray_calls == ["local", "local"]


def test_the_autoscaler_config_is_read_only_for_a_joined_cluster(monkeypatch):
    monkeypatch.setenv(AUTOSCALING_CONFIG_ENV, str(CLUSTER_YAML))  # as on the head of `ray up`
    monkeypatch.setattr(workers.ray, "cluster_resources", lambda: {"CPU": 2.0})
    assert not started_ray_here()  # no Ray in this process
    monkeypatch.setattr(workers, "started_ray_here", lambda: False)  # joined the head's Ray
    assert joined_node_types() == [({"CPU": 8.0, "GPU": 1.0}, 16), ({"CPU": 48.0, "GPU": 4.0}, 4)]
    assert worker_shape() == {"CPU": 8.0, "GPU": 1.0}  # its autoscaler can add GPU nodes
    monkeypatch.setattr(workers, "started_ray_here", lambda: True)  # a new local Ray
    assert joined_node_types() is None
    assert worker_shape() == CPU_WORKER  # the head's GPU nodes never join it


def test_a_ray_without_its_dashboard_packages_starts_without_the_dashboard(monkeypatch,
                                                                          caplog):
    # A minimal Ray (carried onto a GPU image without `ray[default]`'s packages):
    # include_dashboard=True would stop ray.init; the dashboard is left off, saying so.
    monkeypatch.setitem(__import__("sys").modules, "ray.dashboard.optional_deps", None)
    assert session.dashboard_installed() is False
    assert "Ray's dashboard is off" in caplog.text and "ray[default]" in caplog.text
    monkeypatch.undo()
    assert session.dashboard_installed() is True  # this install has them
