"""What a search prints as it goes (issue 41, item 5): a Ray Tune callback beside the
searcher, in place of Tune's own boxes (trial configs, status tables, result dicts),
which print only at verbose 2.

For each trial (one worker group: one N, several B) a line as it starts, with the
candidates done and left in the round; then a line per candidate as its row arrives: its
measured step time, or its failure. E.g.

    N=2, round 1: a worker group for B = 32, 256, 2048 (3 candidates done, 3 left)
      [4/6] N=2 B=32 (b=16): step 28.1 ms

Tune calls the searcher before its callbacks, so the searcher's counts include the row
just reported. A restored experiment's callback is restored with its searcher (Tune
saves both in one pickle), so the counts stay the searcher's own.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from ray.tune import Callback

from searchers.tula_searcher import TulaSearcher
from tula_ray.profile_table import STATUS_OK
from tula_ray.verbosity import LINE_WIDTH, show


def launch_line(config: dict[str, Any], done: int, left: int) -> str:
    """A trial starting: its N, round and batches, the round's candidates done and left."""
    batches = ", ".join(str(b) for b in config.get("global_batches", []))
    return (f"N={config.get('num_workers')}, round {config.get('round')}: a worker group for "
            f"B = {batches} ({done} candidates done, {left} left)")


def candidate_line(result: dict[str, Any], done: int, left: int) -> str:
    """A candidate's row: N, B, b and the measured step time, or how it failed; one line
    of at most LINE_WIDTH characters (the searcher logs a failure's whole error once)."""
    n, b = int(result["num_workers"]), int(result["global_batch"])
    head = f"  [{done}/{done + left}] N={n} B={b} (b={result.get('local_batch', b // n)}): "
    step_s = result.get("step_time_s", math.nan)
    if result.get("status") == STATUS_OK and step_s == step_s:
        step_ms = 1e3 * float(step_s)
        return f"{head}step {step_ms:.3g} ms" if step_ms < 1e3 else f"{head}step {step_ms:.0f} ms"
    failure = f"{result.get('status', 'error')} ({result.get('failure', '')}): " \
              f"{result.get('error', '')}"
    return head + textwrap.shorten(failure, LINE_WIDTH - len(head), placeholder=" ...")


class SearchProgress(Callback):
    """The search's progress lines (`tula_ray.verbosity.show`: printed at verbose 1 and
    above), read from the searcher the experiment drives."""

    def __init__(self, searcher: TulaSearcher, verbose: int):
        self._searcher = searcher
        self._verbose = verbose
        self._shown: set[tuple[int, int]] = set()  # a failed group re-reports every batch

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        show(launch_line(trial.config, *self._searcher.progress), self._verbose)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        if "global_batch" not in result:  # the launch's own total, not a candidate
            return
        key = (int(result["num_workers"]), int(result["global_batch"]))
        if key not in self._shown:
            self._shown.add(key)
            show(candidate_line(result, *self._searcher.progress), self._verbose)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        show(f"N={trial.config.get('num_workers')}: its trial failed (the error is above); "
             "the batches it had not measured are error rows", self._verbose)
