"""TulaSearcher: the (N, B) candidates of full or partial search, one Tune trial each.

Full search profiles every candidate; partial search only the extremes
(min/max N x min/max B, paper §III-A2). A candidate that runs out of memory
lowers the local-batch bound for every N (memory per worker depends on b
only), and partial search then falls back to the next batch inward so that the
model stays identified (paper §IV-B: "relaunching progressively smaller
batches until a feasible configuration is found").
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Iterable

from ray.tune.search import Searcher

from tula_ray.perf import MODES
from tula_ray.profile_table import STATUS_OK, STATUS_OOM, profile_row
from tula_ray.space import Candidate

logger = logging.getLogger(__name__)


def _key(num_workers: int, global_batch: int) -> str:
    return f"{num_workers}x{global_batch}"


class TulaSearcher(Searcher):
    """Suggests candidates as Tune configs {"num_workers": N, "global_batch": B}.

    What every trial shares (the workload, step counts, ...) belongs in the Tuner's
    `param_space`: Tune merges it into each suggested config, as with Ray's own
    searchers, so this searcher's state stays plain JSON (a user's Workload object
    never enters it).

    Args:
        candidates: the (N, B) grid of the search space.
        search_mode: "full" (every candidate) or "partial" (the extremes).
        metric, mode: as in every Tune searcher (step time, minimised).
    """

    def __init__(
        self,
        candidates: Iterable[Candidate],
        search_mode: str = "partial",
        metric: str = "step_time_s",
        mode: str = "min",
    ):
        super().__init__(metric=metric, mode=mode)
        if search_mode not in MODES:
            raise ValueError(f"search_mode {search_mode!r} is not allowed; use one of {MODES}")
        self._candidates = sorted(set(candidates), key=lambda c: (c.num_workers, c.global_batch))
        if not self._candidates:
            raise ValueError("TulaSearcher needs at least one candidate")
        self._search_mode = search_mode
        self._running: dict[str, str] = {}  # trial id -> candidate key
        self._rows: dict[str, dict[str, Any]] = {}  # candidate key -> profile row

    # --- what to profile next -------------------------------------------------

    @property
    def oom_local_batch(self) -> float:
        """Smallest local batch that ran out of memory so far (inf if none)."""
        ooms = [row["local_batch"] for row in self._rows.values() if row["status"] == STATUS_OOM]
        return min(ooms, default=math.inf)

    def _state_of(self, candidate: Candidate) -> str:
        key = _key(candidate.num_workers, candidate.global_batch)
        if key in self._running.values():
            return "running"
        if key in self._rows:
            return self._rows[key]["status"]
        if candidate.local_batch >= self.oom_local_batch:
            return "skipped"
        return "todo"

    def _needed(self) -> list[Candidate]:
        if self._search_mode == "full":
            return [c for c in self._candidates if self._state_of(c) == "todo"]
        needed = []
        sizes = [c.num_workers for c in self._candidates]
        for n in sorted({min(sizes), max(sizes)}):
            at_n = [c for c in self._candidates if c.num_workers == n]
            for side in (at_n, at_n[::-1]):  # the smallest batch, then the largest
                for candidate in side:
                    state = self._state_of(candidate)
                    if state in ("todo", "running"):
                        needed.append(candidate)
                    if state in ("todo", "running", STATUS_OK):
                        break  # this side is covered (or will be); else try inward
        return list(dict.fromkeys(needed))

    def suggest(self, trial_id: str) -> dict | str | None:
        todo = [c for c in self._needed() if self._state_of(c) == "todo"]
        if todo:
            candidate = todo[0]
            self._running[trial_id] = _key(candidate.num_workers, candidate.global_batch)
            return {"num_workers": candidate.num_workers, "global_batch": candidate.global_batch}
        if self._running:
            return None  # wait: a running candidate may fail and need a fallback
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        key = self._running.pop(trial_id, None)
        config = (result or {}).get("config", {})
        if key is None and "num_workers" in config:  # a trial resumed by Tune after restore
            key = _key(config["num_workers"], config["global_batch"])
        if key is None:
            logger.warning("result of unknown trial %s ignored", trial_id)
            return
        n, b = (int(part) for part in key.split("x"))
        failure = str((result or {}).get("error", "trial failed")) if error else None
        row = profile_row(n, b, result, failure)
        self._rows[key] = row
        if row["status"] != STATUS_OK:
            logger.warning("candidate N=%d B=%d: %s %s", n, b, row["status"], row.get("error", ""))

    # --- results and checkpointing ----------------------------------------------

    @property
    def profiles(self) -> list[dict[str, Any]]:
        """The profile rows collected so far, one per finished candidate."""
        return list(self._rows.values())

    def get_state(self) -> dict:
        return {"search_mode": self._search_mode, "rows": self._rows,
                "candidates": [[c.num_workers, c.global_batch] for c in self._candidates]}

    def set_state(self, state: dict) -> None:
        self._search_mode = state["search_mode"]
        self._rows = state["rows"]
        self._candidates = [Candidate(n, b) for n, b in state["candidates"]]
        # Trials that were running when the search stopped did not finish: they
        # are profiled again; finished ones are never repeated.
        self._running = {}

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as handle:
            json.dump(self.get_state(), handle)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as handle:
            self.set_state(json.load(handle))
