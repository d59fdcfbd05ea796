"""The one shape of a benchmark's run: measure (resuming what the results keep), stamp the
result with its provenance, write it and its report, print the report.

A benchmark's `report(result)` makes its markdown from the recorded result alone (what a
JSON round trip keeps), so the report of any run can be rebuilt from results/NAME.json
(tests/test_benchmark_reports.py does, for every recorded benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.common.provenance import provenance
from benchmarks.common.results import RESULTS_DIR, write_result
from benchmarks.common.resumable import KeptParts

Report = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Benchmark:
    """One run of the benchmark `name`; --quick writes NAME_quick.* (git-ignored), never
    the recorded figures."""

    name: str
    quick: bool = False

    @property
    def output(self) -> str:
        """The stem of this run's files in results/."""
        return self.name + ("_quick" if self.quick else "")

    def path(self, suffix: str) -> Path:
        """A file of this run beside its result: `.runs.jsonl`, `.png`, `.plan.json`..."""
        return RESULTS_DIR / f"{self.output}{suffix}"

    def log(self, suffix: str = ".runs.jsonl") -> Path:
        """The log a resumable run appends to: a quick run starts it afresh, a full run
        goes on from what it recorded."""
        log = self.path(suffix)
        if self.quick:
            log.unlink(missing_ok=True)
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        return log

    def kept_parts(self, commit: str) -> KeptParts:
        """Parts measured at `commit` by an earlier session (results/NAME.partial.json)."""
        return KeptParts(RESULTS_DIR / f"{self.name}.partial.json", commit)

    def record(self, measured: dict[str, Any], report: Report, nested: bool = False,
               output: str | None = None) -> dict[str, Any]:
        """`measured` stamped with its provenance (its keys first, or under "provenance"
        with `nested`), written with its report as results/OUTPUT.{json,md}; the report
        printed. output: another stem than this run's (a run that decides it late)."""
        stamp = {"provenance": provenance()} if nested else provenance()
        result = {**stamp, **measured}
        markdown = report(result)
        write_result(output or self.output, result, markdown)
        print(markdown)
        return result
