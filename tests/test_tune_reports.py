"""`trainables.tune_reports.TuneReports` without Ray: every report of a Train run reaches
Tune from the calling thread, in order, and what `fit` raised comes after them all.
(Ray's own `TuneReportCallback` reports from the trial's main thread instead, beside the
function's thread, and the two can wait on each other for ever: the module's docstring.)
"""

import queue
import threading
import time

import pytest

from trainables import tune_reports


class LocalQueue(queue.Queue):
    """`ray.util.queue.Queue`'s calls that `TuneReports` makes, in one process."""

    def __init__(self, actor_options=None) -> None:
        super().__init__()

    def get(self, block=True, timeout=None):
        try:
            return super().get(block, timeout)
        except queue.Empty:
            raise tune_reports.Empty from None

    def shutdown(self) -> None:
        pass


class Trainer:
    """Reports `rows` through its callbacks, as Ray Train's controller does, slowly (the
    reporting thread must wait for them), then raises `error` or returns."""

    def __init__(self, callbacks: list, rows: list[dict], error: Exception | None) -> None:
        self.callbacks, self.rows, self.error = callbacks, rows, error
        self.fit_thread = None

    def fit(self) -> None:
        self.fit_thread = threading.get_ident()
        for row in self.rows:
            time.sleep(0.05)
            for callback in self.callbacks:
                callback.after_report(None, [row, {"rank": 1}], None)
        if self.error is not None:
            raise self.error


@pytest.fixture
def reported(monkeypatch):
    made = []
    monkeypatch.setattr(tune_reports, "Queue", LocalQueue)
    monkeypatch.setattr(tune_reports.tune, "report",
                        lambda metrics: made.append((threading.get_ident(), metrics)))
    return made


@pytest.mark.parametrize("error", [None, RuntimeError("rank 0 died")])
def test_every_report_comes_from_the_calling_thread_in_order_then_the_error(reported, error):
    rows = [{"global_batch": 32}, {"global_batch": 64}, {"global_batch": 128}]
    reports = tune_reports.TuneReports()
    trainer = Trainer(reports.callbacks, rows, error)
    if error is None:
        reports.fit(trainer)
    else:
        with pytest.raises(RuntimeError, match="rank 0 died"):
            reports.fit(trainer)
    assert [metrics for _, metrics in reported] == rows  # rank 0's, each once, in order
    assert {thread for thread, _ in reported} == {threading.get_ident()}
    assert trainer.fit_thread != threading.get_ident()  # fit ran beside, not here
