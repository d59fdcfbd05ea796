"""What a resumable benchmark keeps as it goes, so that a session cut short loses only the
run in progress: finished runs appended to a log (results/NAME.runs.jsonl), whole parts kept
per commit (results/NAME.partial.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from benchmarks.common.gloo import spawn_gloo


def recorded_runs(worker: Callable[..., None], runs: list[dict], log: Path,
                  key: Callable[[dict], tuple], world_size: int) -> list[dict]:
    """Train, on `world_size` gloo workers (`worker(rank, todo, log)`), the runs of `runs`
    that `log` does not record yet (runs match by `key`); then the log's records of
    `runs`, in the order they finished. What a resumable benchmark's runs share."""
    done = {key(r) for r in read_runs(log)}
    todo = [r for r in runs if key(r) not in done]
    if todo:
        spawn_gloo(worker, world_size, todo, str(log))
    wanted = {key(r) for r in runs}
    return [r for r in read_runs(log) if key(r) in wanted]


def rotated_schedule(seeds, batches) -> list[tuple[int, int]]:
    """(seed, batch) of every batch on every seed: the seeds in turn, the batches' order
    rotating one place from one seed to the next, so that no batch always runs first
    (after the machine idled)."""
    batches = list(batches)
    schedule = []
    for turn, seed in enumerate(seeds):
        shift = turn % len(batches)
        schedule += [(seed, b) for b in batches[shift:] + batches[:shift]]
    return schedule


def read_runs(path: Path) -> list[dict]:
    """The runs a log records, in the order they finished (none if there is no log)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class KeptParts:
    """A long run's parts, each kept in `path` as soon as it is measured; a rerun at the
    same commit takes them from there, a run at another commit measures them all again."""

    def __init__(self, path: Path, commit: str) -> None:
        self.path, self.commit = path, commit
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.parts: dict[str, Any] = saved.get("parts", {}) if saved.get("commit") == commit else {}

    def measure(self, name: str, how: Callable[[], Any]) -> Any:
        """The part `name`: kept, or measured by `how()` now and kept."""
        if name not in self.parts:
            self.parts[name] = how()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"commit": self.commit, "parts": self.parts},
                                            indent=1))
        return self.parts[name]
