"""python -m benchmarks adaptive-batch-v4 (issue 44, item 4): the adaptive-batch benchmark
under its fourth protocol (`benchmarks.accuracy.adaptive_batch_v4_protocol`: why, and what
changed), carried out by version 1's runner (`benchmarks.accuracy.adaptive_batch`): its own
plans, searched on this code, then the selection runs and the scored arms on new seeds,
each run appended to results/adaptive_batch_v4.runs.jsonl as it ends (resumable).

--quick: a smoke test of the runner on the protocol's QUICK, written to
adaptive_batch_v4_quick.* (git-ignored), not a measurement.
"""

from __future__ import annotations

import benchmarks.accuracy.adaptive_batch_v4_protocol as protocol
from benchmarks.accuracy.adaptive_batch import report, runner_of

NAME = protocol.RESULTS_NAME
__all__ = ["NAME", "report", "run"]
run = runner_of(protocol)
