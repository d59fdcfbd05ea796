"""profile_row: the one place a trial's report becomes a profile row."""

from tula_ray.profile_table import STATUS_ERROR, profile_frame, profile_row


def test_a_reported_row_keeps_its_measurements_and_takes_n_b_from_the_config():
    row = profile_row(2, 64, {"num_workers": 99, "status": "ok", "step_time_s": 0.5,
                              "sync_time_s": 0.1, "not_a_column": 1})
    assert row == {"num_workers": 2, "global_batch": 64, "local_batch": 32, "status": "ok",
                   "step_time_s": 0.5, "sync_time_s": 0.1}


def test_a_failed_or_silent_trial_is_an_error_row_not_a_crash():
    crashed = profile_row(1, 32, {"status": "ok"}, error="RayTaskError: boom")
    silent = profile_row(1, 32, {})
    assert (crashed["status"], crashed["error"]) == (STATUS_ERROR, "RayTaskError: boom")
    assert (silent["status"], silent["error"]) == (STATUS_ERROR, "no result reported")
    assert list(profile_frame([crashed, silent])["status"]) == [STATUS_ERROR] * 2
