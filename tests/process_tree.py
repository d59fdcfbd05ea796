"""Processes and listening sockets from /proc, for tests that start Ray processes.

psutil is only importable through Ray's bundled copy here (NOTES-ENV), so the few
things the tests need are read from /proc directly (Linux).
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import time
from pathlib import Path

TCP_LISTEN = "0A"  # the state column of /proc/net/tcp for LISTEN


def descendants(root: int) -> list[int]:
    """Every process below `root` (children, their children, ...)."""
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


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return "?"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def listening_sockets() -> dict[str, tuple]:
    """socket inode -> (address, port) of every listening TCP socket on the machine."""
    sockets = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN:
                host, port = fields[1].split(":")
                sockets[fields[9]] = (_address(host), int(port, 16))
    return sockets


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            if match:
                inodes.add(match.group(1))
    except OSError:  # exited meanwhile
        pass
    return inodes


def is_loopback(host) -> bool:
    mapped = getattr(host, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return host.is_loopback or (mapped is not None and mapped.is_loopback)


def kill_tree(root: int, grace_s: float = 10.0, *, term_first: bool = True) -> None:
    """SIGTERM `root` and everything below it, then SIGKILL what is left after `grace_s`;
    with term_first=False, SIGKILL at once (a crash, no chance to clean up). Only these
    processes: never `ray stop`, which stops every Ray on the machine."""
    kill_trees([root], grace_s, term_first=term_first)


def kill_trees(roots: list[int], grace_s: float = 10.0, *, term_first: bool = True) -> None:
    """`kill_tree` of every root at once: one grace for them all, not one each."""
    pids = [*roots, *(pid for root in roots for pid in descendants(root))]
    for sig in (signal.SIGTERM, signal.SIGKILL) if term_first else (signal.SIGKILL,):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(running(p) for p in pids):
            time.sleep(0.2)


def running(pid: int) -> bool:
    """Whether `pid` still runs. A process that exited is a zombie until its parent reaps
    it, and /proc still lists it: this process's own children are reaped here; others' (an
    orphan whose new parent never reaps, as a container's init may not) count as gone."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our child, just reaped
    except ChildProcessError:
        pass  # not our child, or already reaped
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
