"""The mutation check (tests/mutation_check.py) in the suite: each of the paper's equations
is broken at least once, each mutation points at the current code, and the fast tests
named for it catch it. Not a Ray test: every run is a fast test in a scratch copy, forked
from one process that imported the heavy libraries once (~1-3 s per mutation on 2 cores)."""

from __future__ import annotations

import shutil
import warnings
from dataclasses import replace
from typing import Iterable

from mutation_check import (BEYOND, EQUATIONS, MUTATIONS, ROOT, UNSOUND, Mutation, check,
                            confirm, format_result, run_one, stale_reasons)

# The equations the mutations must cover, each at least once (stated here as well as in
# mutation_check.EQUATIONS, so that dropping one from either is caught).
REQUIRED = {"eq. 2a", "eq. 2b", "eq. 2c ring", "eq. 2c ps", "eq. 3", "eq. 4a", "eq. 4b",
            "eq. 5", "overlap", "log2 N", "knee"}
BUDGET_S = 90.0  # the whole suite must run in 15 minutes on 2 cores: this test's share


def uncovered(mutations: Iterable[Mutation]) -> set[str]:
    """The required equations that no mutation breaks."""
    return REQUIRED - {m.equation for m in mutations}


def test_the_mutations_cover_every_named_equation():
    assert set(EQUATIONS) == REQUIRED, "mutation_check.EQUATIONS differs from REQUIRED"
    unknown = [(m.name, m.equation) for m in MUTATIONS if m.equation not in REQUIRED | {BEYOND}]
    assert not unknown, f"mutations tagged with no required equation: {unknown}"
    assert not uncovered(MUTATIONS), (
        f"no mutation breaks {sorted(uncovered(MUTATIONS))}: add one to "
        "tests/mutation_check.py MUTATIONS")


def test_the_coverage_check_can_fail():
    assert uncovered([m for m in MUTATIONS if m.equation != "knee"]) == {"knee"}
    assert uncovered([]) == REQUIRED


def test_mutation_names_are_unique():
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names))


def test_every_mutation_points_at_the_current_code():
    problems = [reason for m in MUTATIONS for reason in stale_reasons(m)]
    assert not problems, "stale mutations in tests/mutation_check.py:\n" + "\n".join(problems)


def test_a_stale_mutation_is_named_with_what_to_update():
    first = MUTATIONS[0]
    snippet = replace(first, edits=(("no such code", "x"),))
    [reason] = stale_reasons(snippet)
    assert first.name in reason and first.path in reason and "'no such code' occurs 0 times" \
        in reason
    moved = replace(first, path="tula_ray/perf.py")
    assert "tula_ray/perf.py): the file is gone" in stale_reasons(moved)[0]
    gone = replace(first, tests=("tests/test_perf.py::test_no_such_test",))
    assert stale_reasons(gone) == [f"mutation {first.name!r} ({first.path}): test "
                                   "tests/test_perf.py::test_no_such_test is gone; name the "
                                   "test that now covers it"]
    broken = replace(first, edits=((first.edits[0][0], "        return ("),))
    assert "does not compile" in stale_reasons(broken)[0]


class FakeRunner:
    """Answers every pytest run with one exit status and output; records the arguments."""

    def __init__(self, rc: int, output: str = ""):
        self.rc, self.output, self.runs = rc, output, []

    def run(self, args, timeout_s):
        self.runs.append(list(args))
        return self.rc, self.output


def test_a_run_is_caught_missed_or_an_error_by_pytests_exit_status(tmp_path):
    """The verdicts the check can give, on a copy of the mutated file (no pytest runs)."""
    first = MUTATIONS[0]
    (tmp_path / first.path).parent.mkdir(parents=True)
    shutil.copy(ROOT / first.path, tmp_path / first.path)
    shutil.copytree(ROOT / "tests", tmp_path / "tests")
    original = (tmp_path / first.path).read_text()
    node = first.tests[0]
    caught = run_one(first, tmp_path, FakeRunner(1, f"FAILED {node} - assert 17 == 13"))
    assert (caught.outcome, caught.caught_by) == ("caught", node)
    missed = run_one(first, tmp_path, FakeRunner(0))
    assert missed.outcome == "missed" and "sharpen one" in missed.detail
    error = run_one(first, tmp_path, FakeRunner(4, "ERROR: not found: x"))
    assert error.outcome == "error" and "not found" in error.detail
    assert (tmp_path / first.path).read_text() == original  # restored after each run
    runner = FakeRunner(1)
    assert run_one(replace(first, edits=(("no such code", "x"),)), tmp_path,
                   runner).outcome == "stale"
    assert runner.runs == []  # a stale mutation is not run
    # A test that fails without the mutation too caught nothing.
    [unsound], _ = confirm([caught], FakeRunner(1, f"FAILED {node} - broken anyway"))
    assert unsound.outcome == "error" and UNSOUND in unsound.detail
    assert confirm([caught], FakeRunner(0))[0] == [caught]


def test_the_fast_tests_catch_every_mutation():
    results, seconds = check(MUTATIONS)
    table = "\n".join(format_result(r) for r in results)
    print(f"{table}\n{len(results)} mutations in {seconds:.1f} s")
    bad = [r for r in results if r.outcome != "caught"]
    assert not bad, (
        f"{len(bad)} of {len(results)} mutations not caught (tests/mutation_check.py; a "
        "missed one needs a sharper fast test, a stale one its snippet or test updated to "
        "the current code):\n" + "\n".join(format_result(r) for r in bad))
    if seconds > BUDGET_S:
        warnings.warn(f"the mutation check took {seconds:.0f} s, over its {BUDGET_S:.0f} s "
                      "share of the suite: name faster catching tests", stacklevel=1)
