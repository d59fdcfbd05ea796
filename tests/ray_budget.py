"""Counting what a test run paid Ray for: how many Rays it started, how many worker groups
Ray Train launched (about 30 s each on 2 cores: the launches dominate the suite).

Counted from what Ray leaves on disk, so that a subprocess's own Ray and a cluster's
count as well as the test process's: every Ray start makes one session directory under
Ray's temp dir, and Ray Train's controller logs "Started training worker group" once per
worker group in that session's logs/train/ray-train-sys-controller-*.log. A Ray started
where this run cannot see (another machine, another temp dir: `ray up` over SSH) adds
its counts with `record_elsewhere` before its temp dir goes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

WORKER_GROUP_STARTED = "Started training worker group"
ELSEWHERE_FILE = "counted_elsewhere.jsonl"


@dataclass
class RayBudget:
    ray_dir: Path  # Ray's temp dir of this run ($RAY_TMPDIR/ray)
    ray_starts: int = 0
    launches: int = 0
    per_session: dict[str, int] = field(default_factory=dict)
    by_test: dict[str, int] = field(default_factory=dict)  # launches each test started

    def count(self) -> None:
        sessions = sorted(p for p in self.ray_dir.glob("session_*")
                          if p.is_dir() and not p.is_symlink())
        self.per_session = {p.name: _launches(p) for p in sessions}
        elsewhere = _elsewhere(self.ray_dir)
        self.ray_starts = len(sessions) + sum(e.get("ray_starts", 0) for e in elsewhere)
        self.launches = (sum(self.per_session.values())
                         + sum(e.get("launches", 0) for e in elsewhere))

    def exceeded(self, ray_starts_budget: int, launches_budget: int) -> bool:
        return self.ray_starts > ray_starts_budget or self.launches > launches_budget

    def report(self, ray_starts_budget: int, launches_budget: int, applies: bool) -> list[str]:
        verdict = ("" if not applies else
                   " -- OVER BUDGET: the run fails" if self.exceeded(
                       ray_starts_budget, launches_budget) else " -- within budget")
        lines = [f"Ray starts: {self.ray_starts} (budget {ray_starts_budget}); worker-group "
                 f"launches: {self.launches} (budget {launches_budget}){verdict}"]
        if not applies:
            lines.append("(a selection of the Ray tests: the budget applies to a whole run)")
        lines += [f"  {name}: {count} launches" for name, count in self.per_session.items()]
        lines += [f"  elsewhere: {entry}" for entry in _elsewhere(self.ray_dir)]
        lines += ["launches per test (its fixtures' where it set them up):"]
        lines += [f"  {count:3d}  {test}" for test, count in
                  sorted(self.by_test.items(), key=lambda item: -item[1])]
        return lines


def _launches(session: Path) -> int:
    logs = (session / "logs" / "train").glob("ray-train-sys-controller-*.log")
    return sum(log.read_text(errors="replace").count(WORKER_GROUP_STARTED) for log in logs)


def _elsewhere(ray_dir: Path) -> list[dict]:
    path = ray_dir / ELSEWHERE_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def this_runs_ray_dir() -> Path:
    """Ray's temp dir of this test run (tests/conftest.py sets $RAY_TMPDIR)."""
    return Path(os.environ["RAY_TMPDIR"]) / "ray"


def record_elsewhere(other_ray_dir: Path, what: str) -> None:
    """Count the Ray starts and launches of a Ray this run started with a temp dir of its
    own (`other_ray_dir`: its session_* directories), before that dir is removed."""
    other = RayBudget(other_ray_dir)
    other.count()
    ray_dir = this_runs_ray_dir()
    ray_dir.mkdir(parents=True, exist_ok=True)
    with (ray_dir / ELSEWHERE_FILE).open("a") as out:
        out.write(json.dumps({"what": what, "ray_starts": other.ray_starts,
                              "launches": other.launches}) + "\n")
