"""The local default exposes nothing (issue 13, item 6): every TCP socket that the Ray
started by `tula_ray.cluster.ensure_ray()` listens on (GCS, raylet, dashboard, agents,
workers) is bound to a loopback address.

The sockets are found from /proc: the listening sockets of /proc/net/tcp{,6} whose
inodes belong to this test process's descendants (every Ray process a local
`ray.init` starts is one).
"""

import ipaddress
import os
import re
import sys
from pathlib import Path

import pytest
import ray
from ray import cloudpickle

from tula_ray.cluster import ADDRESS_ENV, ensure_ray

pytestmark = pytest.mark.ray
# Ray workers cannot import this test module: ship its functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TCP_LISTEN = "0A"  # the state column of /proc/net/tcp for LISTEN


@pytest.fixture(scope="module")
def local_ray():
    saved_address = os.environ.pop(ADDRESS_ENV, None)  # nothing names a cluster
    saved_auth = os.environ.get("RAY_AUTH_MODE")
    try:
        assert ensure_ray() is True  # it started Ray (so the caller shuts it down)
        # A task and an actor, so worker processes listen too.
        ray.get(ray.remote(lambda: 1).remote())
        actor = ray.remote(_Echo).remote()
        ray.get(actor.echo.remote(1))
        yield actor
    finally:
        ray.shutdown()
        if saved_address is not None:
            os.environ[ADDRESS_ENV] = saved_address
    assert os.environ.get("RAY_AUTH_MODE") == saved_auth  # authentication left as it was


class _Echo:
    def echo(self, value):
        return value


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listening() -> dict[str, tuple[str, int]]:
    """socket inode -> (address, port) of every listening TCP socket on the machine."""
    sockets = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN:
                host, port = fields[1].split(":")
                sockets[fields[9]] = (_address(host), int(port, 16))
    return sockets


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # exited meanwhile
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after "(comm)"
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            if match:
                inodes.add(match.group(1))
    except OSError:  # exited meanwhile
        pass
    return inodes


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "?"


def test_every_socket_ray_listens_on_is_loopback(local_ray):
    sockets = _listening()
    found = [(pid, _command(pid), *sockets[inode]) for pid in _descendants(os.getpid())
             for inode in _socket_inodes(pid) if inode in sockets]
    exposed = [f"{command[:80]} on {host}:{port}" for _, command, host, port in found
               if not (host.is_loopback or getattr(host, "ipv4_mapped", None)
                       and host.ipv4_mapped.is_loopback)]
    assert exposed == []
    commands = " ".join(command for _, command, _, _ in found)
    # The GCS, the raylet, the dashboard and workers are among them: the check saw Ray.
    gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
    assert gcs_port in {port for *_, port in found}
    for process in ("gcs_server", "raylet", "dashboard.py", "ray::_Echo"):
        assert process in commands, f"no listening socket of {process} found"
