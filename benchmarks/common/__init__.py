"""What the benchmarks share: where results go and how a run records them (`scaffold`), its
provenance, markdown tables, summaries of a sample, and gloo workers for the runs off Ray."""

from benchmarks.common.gloo import spawn_gloo
from benchmarks.common.markdown import markdown_table
from benchmarks.common.provenance import COMMIT_ENV, provenance
from benchmarks.common.results import RESULTS_DIR, read_result, write_result
from benchmarks.common.resumable import KeptParts, read_runs, recorded_runs, rotated_schedule
from benchmarks.common.scaffold import Benchmark
from benchmarks.common.summaries import cross_search_errors, relative_errors, spread

__all__ = ["Benchmark", "COMMIT_ENV", "KeptParts", "RESULTS_DIR", "cross_search_errors",
           "markdown_table", "provenance", "read_result", "read_runs", "recorded_runs",
           "relative_errors", "rotated_schedule", "spawn_gloo", "spread", "write_result"]
