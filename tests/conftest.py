"""Shared fixtures. Ray-marked tests start their own session per module (see tests/ray_session.py)."""

import os

# Ray's token auth makes the dashboard API answer 401 to our test clients; the
# product never changes this for its users, only the test process does.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
