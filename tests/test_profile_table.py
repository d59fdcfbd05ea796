"""profile_row: the one place a profile row is built (a trial's report, a failure, or the
profiling loop's row before it measures)."""

import math

from tula_ray.profile_table import (PROFILE_COLUMNS, STATUS_ERROR, STATUS_OK, STATUS_OOM,
                                    profile_frame, profile_row)


def test_a_reported_row_keeps_its_measurements_and_takes_n_b_from_the_config():
    row = profile_row(2, 64, {"num_workers": 99, "status": "ok", "step_time_s": 0.5,
                              "sync_time_s": 0.1, "not_a_column": 1})
    assert set(row) == set(PROFILE_COLUMNS)  # every column, and nothing else
    assert {k: row[k] for k in ("num_workers", "global_batch", "local_batch", "status",
                                "step_time_s", "sync_time_s", "error")} == {
        "num_workers": 2, "global_batch": 64, "local_batch": 32, "status": "ok",
        "step_time_s": 0.5, "sync_time_s": 0.1, "error": ""}
    assert math.isnan(row["compute_time_s"])  # not reported: not measured


def test_a_failed_or_silent_trial_is_an_error_row_not_a_crash():
    crashed = profile_row(1, 32, {"status": "ok"}, error="RayTaskError: boom")
    silent = profile_row(1, 32, {})
    assert (crashed["status"], crashed["error"]) == (STATUS_ERROR, "RayTaskError: boom")
    assert (silent["status"], silent["error"]) == (STATUS_ERROR, "no result reported")
    assert list(profile_frame([crashed, silent])["status"]) == [STATUS_ERROR] * 2


def test_a_given_status_wins_and_long_errors_keep_their_tail():
    oom = profile_row(2, 64, status=STATUS_OOM, error="x" * 4000 + "end")
    assert oom["status"] == STATUS_OOM and len(oom["error"]) == 2000
    assert oom["error"].endswith("end") and math.isnan(oom["step_time_s"])
    fresh = profile_row(1, 32, status=STATUS_OK)  # the profiling loop's row before it measures
    assert (fresh["status"], fresh["error"]) == (STATUS_OK, "")
