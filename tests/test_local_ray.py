"""The local default exposes nothing (issue 13, item 6): every TCP socket that the Ray
started by `tula_ray.cluster.start_local_ray()` (what `ensure_ray()` starts) listens on
(GCS, raylet, dashboard, agents, workers) is bound to a loopback address.

The sockets are found from /proc: the listening sockets of /proc/net/tcp{,6} whose
inodes belong to this test process's descendants (every Ray process a local
`ray.init` starts is one).
"""

import os
import sys

import pytest
import ray
from ray import cloudpickle

from process_tree import command, descendants, is_loopback, listening_sockets, socket_inodes


pytestmark = pytest.mark.ray
# Ray workers cannot import this test module: ship its functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def local_ray(ray_session):
    """The run's shared Ray: the product's local start (`start_local_ray`, which
    `ensure_ray()` calls when nothing names a cluster: tests/test_cluster_session.py),
    with a task and an actor, so that worker processes listen too."""
    ray.get(ray.remote(lambda: 1).remote())
    actor = ray.remote(_Echo).remote()
    ray.get(actor.echo.remote(1))
    yield actor
    ray.kill(actor)
    assert os.environ.get("RAY_AUTH_MODE") == "disabled"  # the tests' own, left as it was


class _Echo:
    def echo(self, value):
        return value


def _this_rays_processes() -> list[int]:
    """This session's Ray processes: those of this process's descendants that name its
    session, and everything they started (workers rename themselves to "ray::..."); not
    what an earlier test of the same pytest run may have left behind."""
    session = ray._private.worker.global_worker.node.session_name
    mine = descendants(os.getpid())
    roots = [pid for pid in mine if session in command(pid)]
    return sorted({*roots, *(child for root in roots for child in descendants(root))})


def test_every_socket_ray_listens_on_is_loopback(local_ray):
    sockets = listening_sockets()
    found = [(pid, command(pid), *sockets[inode]) for pid in _this_rays_processes()
             for inode in socket_inodes(pid) if inode in sockets]
    exposed = [f"{line[:80]} on {host}:{port}" for _, line, host, port in found
               if not is_loopback(host)]
    assert exposed == []
    commands = " ".join(line for _, line, _, _ in found)
    # The GCS, the raylet, the dashboard and workers are among them: the check saw Ray.
    gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    assert gcs_port in {port for *_, port in found}
    for process in ("gcs_server", "raylet", "dashboard.py", "ray::_Echo"):
        assert process in commands, f"no listening socket of {process} found"
