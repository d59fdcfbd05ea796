"""python -m benchmarks adaptive-batch-v3 (issue 44, item 4): the adaptive-batch benchmark
under its third protocol (`benchmarks.accuracy.adaptive_batch_v3_protocol`: why, and what
changed), carried out by version 1's runner (`benchmarks.accuracy.adaptive_batch`): version
2's plans and selection runs, read; then the scored arms on the new scoring seeds, each run
appended to results/adaptive_batch_v3.runs.jsonl as it ends (resumable).

--quick: a smoke test of the runner on the protocol's QUICK, written to
adaptive_batch_v3_quick.* (git-ignored), not a measurement.
"""

from __future__ import annotations

import benchmarks.accuracy.adaptive_batch_v3_protocol as protocol
from benchmarks.accuracy.adaptive_batch import report, runner_of

NAME = protocol.RESULTS_NAME
__all__ = ["NAME", "report", "run"]
run = runner_of(protocol)
