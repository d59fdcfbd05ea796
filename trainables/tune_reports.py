"""A Tune function trainable's Ray Train run, with every report to Tune made by ONE thread:
the function's own.

Ray's way (`ray.tune.integration.ray_train.TuneReportCallback`) hands each worker report
to the trial session's inter-actor queue, a Ray Queue of one item, and the trial's MAIN
thread reports it: a blocking put into the session's result queue, which also holds one
item and which only that thread empties. Whatever the function's thread reports goes
into the same result queue: a row after the Train run (a failed launch's error rows, the
launch's total, a crashed configuration's score), and Tune's wrapper's own last report
when the function returns. Should the main thread take a late worker report while one of
those waits there, it waits on itself and the function's thread on it: the trial never
ends, and the search with it (Ray 2.60's `ray/train/_internal/session.py`; stop 61's CI
hang, and a suite run of stop 63).

So `TuneReports.fit` runs `TorchTrainer.fit` in a helper thread, and its callback puts each
report into a queue of the trial's own, which the function's thread reports from: the
session's inter-actor queue is never made, and every report, the workers' and the
function's, comes from one thread, in order. Ray-facing (`trainables`).
"""

from __future__ import annotations

import threading
from typing import Any

from ray import tune
from ray.train import UserCallback
from ray.util.queue import Empty, Queue

POLL_S = 0.2  # how often the function's thread looks whether the Train run has ended


class ForwardReports(UserCallback):
    """In Ray Train's controller: rank 0's metrics of each report, into the trial's queue
    (as `TuneReportCallback` forwards them; the trials here report no checkpoint)."""

    def __init__(self, reports: Queue) -> None:
        self.reports = reports

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                     checkpoint: Any) -> None:
        self.reports.put(dict(metrics[0]))


class TuneReports:
    """One Train run's reports to Tune, all from the thread that calls `fit`: build the
    TorchTrainer with `callbacks` in its RunConfig, then `fit` it here. Call both from a
    Tune function trainable's thread."""

    def __init__(self) -> None:
        self.queue = Queue(actor_options={"num_cpus": 0})
        self.callbacks = [ForwardReports(self.queue)]

    def fit(self, trainer: Any) -> None:
        """Fits `trainer` in a helper thread, reporting each of its worker reports to Tune
        from this thread as it comes; returns once the run has ended and every report is
        made, and raises what `trainer.fit` raised."""
        raised: list[BaseException] = []

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                raised.append(exc)

        runner = threading.Thread(target=fit, name="tula-ray-train-fit", daemon=True)
        runner.start()
        # The controller's puts are done before `fit` returns: once the runner has ended,
        # an empty queue is the last report made.
        while runner.is_alive() or not self.queue.empty():
            try:
                tune.report(self.queue.get(timeout=POLL_S))
            except Empty:
                pass
        self.queue.shutdown()
        if raised:
            raise raised[0]
