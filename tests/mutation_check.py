"""Mutation check of the fast tests: break one equation at a time, see a fast test fail.

    .venv/bin/python tests/mutation_check.py [--only NAME ...] [--list]

Each mutation replaces one exact snippet of a core module (it must occur exactly once,
or the mutation is reported stale) in a scratch copy of the repository, then runs the
fast tests (`pytest -m "not ray"`) that cover that module, stopping at the first
failure. A mutation is CAUGHT when some test fails, MISSED when all pass. Not a pytest
module (its name does not start with test_): it runs the suite once per mutation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str  # what is broken, with the paper's equation
    path: str  # file, relative to the repository root
    old: str  # the exact snippet (must occur once)
    new: str  # what it becomes
    tests: tuple[str, ...]  # the fast test files that should catch it


MUTATIONS = (
    Mutation("eq. 2a: step = compute - sync", "tula_ray/perf.py",
             "        return compute_s + sync_s", "        return compute_s - sync_s",
             ("tests/test_perf.py", "tests/test_plan.py")),
    Mutation("eq. 2b: compute per sample doubled", "tula_ray/compute_forms.py",
             "self.per_sample_s * np.asarray(local_batch, float) ** self.exponent",
             "2 * self.per_sample_s * np.asarray(local_batch, float) ** self.exponent",
             ("tests/test_perf.py", "tests/test_plan.py")),
    Mutation("eq. 2b: convex data kept as a line (a negative fixed cost)",
             "tula_ray/compute_forms.py", "    if intercept >= 0 and slope >= 0:\n",
             "    if True:\n", ("tests/test_perf.py", "tests/test_compute_forms.py")),
    Mutation("eq. 2c: ring units 1 - 1/N -> 1 - 2/N", "tula_ray/perf.py",
             "    return 1.0 - 1.0 / n", "    return 1.0 - 2.0 / n",
             ("tests/test_perf.py",)),
    Mutation("eq. 2c: parameter server units N -> N - 1", "tula_ray/perf.py",
             "    return np.where(n > 1, n, 0.0)", "    return np.where(n > 1, n - 1, 0.0)",
             ("tests/test_perf.py",)),
    Mutation("overlap form: exponent 1/p -> 1/(p + 0.5)", "tula_ray/perf.py",
             "** (1.0 / overlap_p)", "** (1.0 / (overlap_p + 0.5))",
             ("tests/test_perf.py",)),
    Mutation("interpolation in N instead of log2(N)", "tula_ray/perf.py",
             "x, xk = np.log2(n), np.log2(known)", "x, xk = n, known",
             ("tests/test_perf.py",)),
    Mutation("per-N compute fit: one curve pooled over every N", "tula_ray/perf.py",
             "        if group[\"local_batch\"].nunique() >= 2\n",
             "        if group[\"local_batch\"].nunique() >= 2 and False\n",
             ("tests/test_perf.py", "tests/test_plan.py")),
    Mutation("eq. 4a: steps per epoch rounded down", "tula_ray/perf.py",
             "steps_per_epoch = np.ceil(steps_per_epoch)",
             "steps_per_epoch = np.floor(steps_per_epoch)",
             ("tests/test_perf.py", "tests/test_plan.py")),
    Mutation("eq. 4b: cost without N", "tula_ray/pricing.py",
             "return hours * np.asarray(num_workers, dtype=float) * usd_per_node_hour",
             "return hours * usd_per_node_hour",
             ("tests/test_pricing.py", "tests/test_plan.py")),
    Mutation("eq. 3: batch term dropped from the prediction", "tula_ray/memory.py",
             "return params.static_bytes + params.overhead_bytes + params.bytes_per_sample * b",
             "return params.static_bytes + params.overhead_bytes + 0 * b",
             ("tests/test_memory.py", "tests/test_plan.py")),
    Mutation("memory bound check: off by one above the limit", "tula_ray/memory.py",
             "    while predict_peak_bytes(params, b + 1) <= limit:\n        b += 1\n    return max(b, 0)",
             "    while predict_peak_bytes(params, b + 1) <= limit:\n        b += 1\n    return max(b + 1, 0)",
             ("tests/test_memory.py",)),
    Mutation("verified bound: the largest checked batch, fitting or not", "tula_ray/memory.py",
             "return max((b for b, p in peaks.items() if p is not None and p <= limit), default=0), checks",
             "return max((b for b, p in peaks.items() if p is not None), default=0), checks",
             ("tests/test_memory.py",)),
    Mutation("eq. 5: variability without the absolute value", "tula_ray/ags.py",
             "return abs((norm_sq - previous_norm_sq) / previous_norm_sq)",
             "return (norm_sq - previous_norm_sq) / previous_norm_sq",
             ("tests/test_ags.py",)),
    Mutation("knee: Kneedle on B instead of log2(B)", "tula_ray/policy.py",
             "    x = np.log2(np.asarray(global_batch, dtype=float))",
             "    x = np.asarray(global_batch, dtype=float)",
             ("tests/test_policy.py", "tests/test_plan.py")),
    Mutation("estimates: a measured candidate judged by its prediction", "tula_ray/estimates.py",
             'time_s = np.where(measured, table["measured_total_time_s"], table["total_time_s"])',
             'time_s = np.where(False, table["measured_total_time_s"], table["total_time_s"])',
             ("tests/test_plan.py",)),
    Mutation("knee curve: interpolation of the measured ratio in B, not log2(B)",
             "tula_ray/estimates.py",
             'factor = np.exp(np.interp(x, np.log2(rows["global_batch"].to_numpy(float)), ratio))',
             'factor = np.exp(np.interp(2 ** x, rows["global_batch"].to_numpy(float), ratio))',
             ("tests/test_plan.py",)),
    Mutation("knee: Kneedle's first knee instead of its most pronounced", "tula_ray/policy.py",
             "return float(2.0 ** locator.x[int(np.argmax(locator.y_difference))])",
             "return float(2.0 ** locator.knee)",
             ("tests/test_policy.py", "tests/test_plan.py")),
)


def _scratch_copy(destination: Path) -> None:
    """The tracked files of the working tree (with uncommitted edits), no .venv or .git."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def run(mutation: Mutation, scratch: Path) -> tuple[str, float]:
    """('caught' | 'missed' | 'stale', seconds) for one mutation applied to `scratch`."""
    path = scratch / mutation.path
    original = path.read_text()
    if original.count(mutation.old) != 1:
        return "stale", 0.0
    path.write_text(original.replace(mutation.old, mutation.new))
    started = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "not ray", "-x", "-q", "-p", "no:cacheprovider",
             *mutation.tests], cwd=scratch, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(scratch)})
    finally:
        path.write_text(original)
    return ("missed" if result.returncode == 0 else "caught"), time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="substrings of mutation names")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or any(s in m.name for s in args.only)]
    if args.list:
        print("\n".join(m.name for m in chosen))
        return 0
    outcomes = {}
    with tempfile.TemporaryDirectory(prefix="tula-mutation-") as directory:
        scratch = Path(directory)
        _scratch_copy(scratch)
        for mutation in chosen:
            outcome, seconds = run(mutation, scratch)
            outcomes[mutation.name] = outcome
            print(f"{outcome:7s} {seconds:6.1f} s  {mutation.name}", flush=True)
    missed = [name for name, outcome in outcomes.items() if outcome != "caught"]
    print(f"{len(outcomes) - len(missed)} of {len(outcomes)} mutations caught"
          + (f"; not caught: {missed}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
