"""A Tune function trainable's own results once its Ray Train run has started: sent the way
the workers' reports come, never with `tune.report` from the function's thread.

While `TorchTrainer.fit` runs, `TuneReportCallback` puts each of the workers' reports in
the trial session's inter-actor queue (a Ray Queue of one item), and the trial's main
thread takes it from there and reports it itself. A result that the function's thread
then reports with `tune.report` races with the last of those. In Ray 2.60
(`ray.train._internal.session`), should the main thread take a forwarded report while
the function's result waits in the session's result queue (also one item, and only the
main thread empties it), the main thread blocks on putting it there, and the function
thread on the main thread: the trial never ends, and the search waits for it without a
word. It happens when a worker group reports a row just before it ends, on a loaded
machine: one of the two error rows of a failed launch reached Tune, and
tests/test_first_contact_ray.py's two-launch test hung until pytest-timeout ended the
run (stop 61's CI, and this stop's first suite run on two processes).

So every result after the Train run has started goes into the same queue, behind the
forwarded ones: one thread reports them all, in order. Ray-facing (`trainables`).
"""

from __future__ import annotations

from typing import Any

from ray.train._internal.session import get_session


def report_after_train(metrics: dict[str, Any]) -> None:
    """Report `metrics` to Tune from a function trainable whose TorchTrainer has been built
    with `TuneReportCallback` (see the module's docstring). Blocks until the trial's main
    thread has taken the previous result, as the callback's own reports do."""
    # The queue TuneReportCallback made (the session keeps one); Ray's integration reaches
    # this private call too, and no public one hands a result to that queue.
    get_session()._get_or_create_inter_actor_queue().put(dict(metrics))
