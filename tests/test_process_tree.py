"""The tests' process helpers (tests/process_tree.py): a process that exited counts as gone
whether or not its parent has reaped it, so `kill_tree` does not wait out its grace on a
zombie (it did: 10 s twice on the fake autoscaling cluster's `ray start`)."""

import signal
import subprocess
import sys
import time

from process_tree import kill_tree, running

# A child that forks a grandchild which exits at once, prints its pid, and never reaps it:
# the grandchild stays a zombie whose parent is not this process.
UNREAPED = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def test_a_killed_child_and_an_unreaped_grandchild_count_as_gone():
    parent = subprocess.Popen([sys.executable, "-c", UNREAPED], stdout=subprocess.PIPE,
                              text=True)
    try:
        grandchild = int(parent.stdout.readline())
        time.sleep(0.2)  # it has exited by now: a zombie
        assert not running(grandchild)
        assert running(parent.pid)
        parent.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while running(parent.pid):  # our own child: reaped by `running`
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        parent.kill()


def test_kill_tree_returns_once_the_tree_is_gone_not_after_its_grace():
    sleeper = subprocess.Popen(["sleep", "60"])
    started = time.monotonic()
    kill_tree(sleeper.pid, grace_s=30)
    assert time.monotonic() - started < 10
    assert not running(sleeper.pid)
