"""TulaSearcher: a Ray Tune searcher over a core search strategy.

A thin adapter, the shape of Ray's `OptunaSearch` over an Optuna sampler: the
decisions (which candidates, when to stop) live in the strategy
(`tula_ray.planning.search_strategies`); this class only translates. Each round it asks
the strategy for candidates and turns them into trials, ONE PER CLUSTER SIZE N
(one Ray Train worker group profiles every batch of its N), records each (N, B)
result as it arrives (`on_trial_result`), and asks again when the round is done.

Its state is plain JSON (rows keyed by candidate, the queue, the round), so an
experiment resumes with `Tuner.restore` and repeats no finished (N, B). What the
trials share (the workload, step counts, ...) is in the Tuner's `param_space`,
which Tune merges into every suggested config, as for Ray's own searchers.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterable

import pandas as pd
from ray.tune.search import Searcher

from tula_ray.failures import deciding_error, record_error
from tula_ray.planning.search_strategies import make_search_strategy
from tula_ray.profile_table import (LAUNCH_TOTAL_KEY, STATUS_OK, TRACEBACK_KEY,
                                    oom_local_batch, profile_frame, profile_row)
from tula_ray.space import Candidate

logger = logging.getLogger(__name__)

# The search's Tune metric and mode, as every Tune searcher has them: the profiled step
# time, minimised (the choice itself is the plan's policy's, not Tune's best trial).
METRIC, MODE = "step_time_s", "min"
MAX_ROUNDS = 1000  # a strategy that never stops is a bug; this keeps it from hanging a search


def _key(num_workers: int, global_batch: int) -> str:
    return f"{int(num_workers)}x{int(global_batch)}"


class TulaSearcher(Searcher):
    """Suggests one trial per cluster size and round:
    {"num_workers": N, "global_batches": [B, ...], "round": r}.

    Args:
        candidates: the (N, B) grid of the search space.
        strategy: a registered search strategy ("full", "partial", ...).
        strategy_options: passed to the strategy's factory.
        metric, mode: as in every Tune searcher (step time, minimised).
        resume_record: JSON the search saves with the experiment for a resume (the
          memory probe's result, the grid's bounds); the searcher only keeps it.
    """

    def __init__(
        self,
        candidates: Iterable[Candidate],
        strategy: str = "partial",
        strategy_options: dict[str, Any] | None = None,
        metric: str = METRIC,
        mode: str = MODE,
        resume_record: dict[str, Any] | None = None,
    ):
        super().__init__(metric=metric, mode=mode)
        self.resume_record = dict(resume_record or {})
        self._candidates = sorted(set(candidates))
        if not self._candidates:
            raise ValueError("TulaSearcher needs at least one candidate")
        self._strategy_name = strategy
        self._strategy_options = dict(strategy_options or {})
        self._strategy = make_search_strategy(strategy, self._strategy_options)
        self._rows: dict[str, dict[str, Any]] = {}  # candidate key -> profile row
        self._queue: list[list] = []  # [N, [B, ...]] still to launch this round
        self._running: dict[str, list] = {}  # trial id -> [N, [B, ...], started_at, round]
        self._sweeps: list[dict[str, Any]] = []  # one per finished trial (= launch)
        self._round = 0
        self._stop_reason = ""
        self._errors: list[dict[str, Any]] = []  # one per distinct error (tula_ray.failures)

    @classmethod
    def from_experiment(cls, path: str, metric: str = METRIC, mode: str = MODE
                        ) -> "TulaSearcher":
        """The searcher as last saved with the Tune experiment at `path`: its candidates,
        strategy, rows, queue and resume record all come from the saved state (`set_state`).
        Raises FileNotFoundError (or Tune's RuntimeError) when no searcher is saved there."""
        searcher = cls.__new__(cls)  # every attribute comes from the state, none from __init__
        Searcher.__init__(searcher, metric=metric, mode=mode)
        searcher.restore_from_dir(path)
        return searcher

    # --- what to profile next -------------------------------------------------

    def _frame(self) -> pd.DataFrame:
        return profile_frame(self._rows.values())

    def _next_round(self) -> bool:
        """Ask the strategy; queue its candidates, one entry per N. False when it is done."""
        if self._round >= MAX_ROUNDS:
            self._stop_reason = f"stopped after {MAX_ROUNDS} rounds (the strategy never ended)"
            return False
        proposal = self._strategy.propose(self._candidates, self._frame())
        fresh = [c for c in proposal.candidates if _key(*_pair(c)) not in self._rows]
        if not fresh:
            self._stop_reason = proposal.reason if proposal.done else (
                f"{proposal.reason}; every candidate it named is already profiled")
            return False
        self._round += 1
        by_size: dict[int, list[int]] = {}
        for candidate in fresh:
            by_size.setdefault(candidate.num_workers, []).append(candidate.global_batch)
        self._queue = [[n, sorted(set(batches))] for n, batches in sorted(by_size.items())]
        logger.info("round %d: %s (%s)", self._round, self._queue, proposal.reason)
        return True

    def suggest(self, trial_id: str) -> dict | str | None:
        if self._running:
            return None  # one trial at a time; the next round depends on this one
        fatal = deciding_error(self._errors)
        if fatal is not None:  # it would fail every candidate the same way
            self._stop_reason = (f"stopped by this error ({fatal['failure']}) on "
                                 f"{len(fatal['candidates'])} candidates: {fatal['error']}")
            return Searcher.FINISHED
        while True:
            if not self._queue and not self._next_round():
                return Searcher.FINISHED
            n, batches = self._queue.pop(0)
            bound = oom_local_batch(self._frame())
            # What an earlier trial of this round learned (an OOM bound) still applies.
            batches = [b for b in batches if _key(n, b) not in self._rows and b // n < bound]
            if batches:
                break
        self._running[trial_id] = [n, batches, time.time(), self._round]
        return {"num_workers": n, "global_batches": batches, "round": self._round}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """One (N, B) of a running trial measured: record it now, not at the trial's end."""
        running = self._running.get(trial_id)
        if running is not None and LAUNCH_TOTAL_KEY in result:
            self._launch_fixed(running, float(result[LAUNCH_TOTAL_KEY]))
            return
        if running is None or "global_batch" not in result:
            return
        n, b = int(running[0]), int(result["global_batch"])
        key = _key(n, b)
        if b not in running[1] or key in self._rows:
            return  # a batch keeps its first row (a failed group re-reports every batch)
        self._rows[key] = profile_row(n, b, result)
        self._record_failure(self._rows[key], result.get(TRACEBACK_KEY, ""), running[3])

    def _launch_fixed(self, running: list, launch_s: float) -> None:
        """The launch's seconds beyond its candidates (its whole `launch_s` less their
        `profile_wall_s`: start, data load, set-up, reports, end) on each row it measured."""
        n, batches, _, round_ = running
        rows = [self._rows[_key(n, b)] for b in batches if _key(n, b) in self._rows]
        rows = [row for row in rows if row["status"] == STATUS_OK and row.get("round") == round_]
        fixed = launch_s - sum(float(row["profile_wall_s"]) for row in rows)
        for row in rows:
            row["launch_fixed_s"] = fixed

    def _record_failure(self, row: dict[str, Any], traceback_text: str, round_: int) -> None:
        """Keep a failed row's error once per distinct error (logged the first time)."""
        if row["status"] == STATUS_OK:
            return
        known = len(self._errors)
        n, b = int(row["num_workers"]), int(row["global_batch"])
        record_error(self._errors, failure=row["failure"], error=row["error"],
                     traceback_text=traceback_text, launch=(round_, n), candidate=(n, b))
        if len(self._errors) > known:
            logger.warning("candidate N=%d B=%d: %s (%s)%s", n, b, row["error"],
                           row["failure"], f"\n{traceback_text}" if traceback_text else "")

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        if result:
            self.on_trial_result(trial_id, result)  # recorded already unless it came last
        running = self._running.pop(trial_id, None)
        if running is None:
            logger.warning("result of unknown trial %s ignored", trial_id)
            return
        n, batches, started_at, round_ = running
        bound = oom_local_batch(self._frame())
        for b in batches:  # a batch the sweep never reached, below any OOM bound: an error
            if _key(n, b) not in self._rows and b // n < bound:
                why = "the trial failed" if error else "the worker group ended before it"
                self._rows[_key(n, b)] = profile_row(n, b, error=f"not profiled: {why}")
                self._record_failure(self._rows[_key(n, b)], "", round_)
        self._sweeps.append({"round": round_, "num_workers": n, "global_batches": batches,
                             "wall_s": time.time() - started_at, "error": bool(error)})

    # --- results and checkpointing ----------------------------------------------

    @property
    def profiles(self) -> list[dict[str, Any]]:
        """The profile rows collected so far, one per profiled candidate."""
        return list(self._rows.values())

    @property
    def sweeps(self) -> list[dict[str, Any]]:
        """One entry per finished trial (one worker-group launch): round, N, batches, wall_s."""
        return list(self._sweeps)

    @property
    def rounds(self) -> int:
        return self._round

    @property
    def progress(self) -> tuple[int, int]:
        """(candidates profiled, candidates left in this round: queued, or in a running
        trial and not measured yet). A strategy may ask for another round when one ends."""
        left = sum(len(batches) for _, batches in self._queue)
        left += sum(1 for n, batches, *_ in self._running.values()
                    for b in batches if _key(n, b) not in self._rows)
        return len(self._rows), left

    @property
    def errors(self) -> list[dict[str, Any]]:
        """Each distinct error once: class, "Type: message", the worker's traceback, and the
        launches (round, N) and candidates (N, B) it hit (`tula_ray.failures.record_error`)."""
        return [dict(entry) for entry in self._errors]

    @property
    def deciding_error(self) -> dict[str, Any] | None:
        """The error that ended the search (`tula_ray.failures.deciding_error`), or None."""
        return deciding_error(self._errors)

    @property
    def stop_reason(self) -> str:
        """Why the search ended (the strategy's reason), "" while it runs."""
        return self._stop_reason

    def get_state(self) -> dict:
        return {"strategy": self._strategy_name, "strategy_options": self._strategy_options,
                "candidates": [[c.num_workers, c.global_batch] for c in self._candidates],
                "rows": self._rows, "queue": self._queue, "running": self._running,
                "sweeps": self._sweeps, "round": self._round, "stop_reason": self._stop_reason,
                "errors": self._errors,
                "context": self.resume_record}  # its key since saved searches had one

    def set_state(self, state: dict) -> None:
        self._strategy_name = state["strategy"]
        self._strategy_options = state["strategy_options"]
        self._strategy = make_search_strategy(self._strategy_name, self._strategy_options)
        self._candidates = [Candidate(n, b) for n, b in state["candidates"]]
        self._rows = state["rows"]
        self._sweeps = state["sweeps"]
        self._round = state["round"]
        self._stop_reason = state["stop_reason"]
        self._errors = state.get("errors", [])
        self.resume_record = state.get("context", {})
        # Trials that were running when the search stopped did not finish: their
        # batches without a row go first again; finished ones are never repeated.
        interrupted = [[n, [b for b in batches if _key(n, b) not in self._rows]]
                       for n, batches, *_ in state["running"].values()]
        self._queue = [entry for entry in interrupted if entry[1]] + state["queue"]
        self._running = {}

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as handle:
            json.dump(self.get_state(), handle)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path) as handle:
            self.set_state(json.load(handle))


def _pair(candidate: Candidate) -> tuple[int, int]:
    return candidate.num_workers, candidate.global_batch
