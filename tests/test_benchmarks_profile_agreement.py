"""The profile-agreement benchmark's smoke test (issue 42, step 3): `run(quick=True)`, one
`tula-ray demo` of N = 1, B = 32 from this tree and one from a checkout of the baseline,
each with its own local Ray (the baseline's workers must run the baseline's code), and
the side-by-side report of their profiles."""

import math

import pytest

from benchmarks.common import RESULTS_DIR
from result_checks import table_rows

pytestmark = pytest.mark.ray


def test_profile_agreement_quick():
    from benchmarks.startup import profile_agreement

    result = profile_agreement.run(quick=True)
    assert sorted(r["tree"] for r in result["runs"]) == sorted(
        ["this", profile_agreement.BASELINE])
    for run in result["runs"]:
        assert [(row["num_workers"], row["global_batch"]) for row in run["rows"]] == [(1, 32)]
        assert all(math.isfinite(row["step_time_s"]) and row["step_time_s"] > 0
                   for row in run["rows"])
    (candidate,) = result["candidates"]
    assert candidate["agree"] == {"step_time_s": None, "compute_time_s": None}  # one run each
    markdown = (RESULTS_DIR / "profile_agreement_quick.md").read_text()
    assert len(table_rows(markdown, "| N | B |")) == 1
