"""The first-contact benchmark's smoke test (issue 22): its two short parts once each, as
a user meets them (fresh processes; the driver's search joins the run's shared Ray through
RAY_ADDRESS, its Ray start is not what is measured here). The long part, README's main
command in a fresh clone, runs in the full benchmark only."""

import pytest

from benchmarks.common import RESULTS_DIR
from result_checks import table_rows

pytestmark = pytest.mark.ray


def test_first_contact_quick(ray_session, monkeypatch):
    from benchmarks.startup import first_contact
    from tula_ray.cluster import ADDRESS_ENV

    monkeypatch.setenv(ADDRESS_ENV, ray_session)  # the benchmark's drivers inherit it

    result = first_contact.run(quick=True)
    parts = result["parts"]
    driver = parts["driver_only_data"]["outcomes"][0]
    assert driver["raised"] == "UserCodeError" and driver["cause_named"]
    assert driver["worker_traceback"] and driver["trial_dirs"] == 0
    assert driver["seconds"] < first_contact.GOAL_DRIVER_ONLY_S
    means = parts["no_means"]
    if "skipped" not in means:  # needs root for a network namespace
        assert means["outcomes"][0]["exit_code"] == 2 and means["outcomes"][0]["says_what_to_do"]
    markdown = (RESULTS_DIR / "first_contact_quick.md").read_text()
    assert len(table_rows(markdown, "| what | goal | measured | met |")) == 2 - (
        "skipped" in means)
    assert "tula-ray demo" in first_contact.main_command()  # README's, read as .ci/run does
