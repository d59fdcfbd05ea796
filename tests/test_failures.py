"""The search's one taxonomy of failures (tula_ray.failures, issue 22 item 3), without Ray:
how a worker's exception is sorted, the record of distinct errors, which error ends a
search, and the searcher acting on it."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist
from ray.tune.search import Searcher

from searchers import TulaSearcher
from test_searcher import SPACE, ok_row, pairs, run
from tula_ray.failures import (UserCodeError, classify, deciding_error, describe_errors,
                               is_out_of_memory, record_error, workload_code)
from tula_ray.profile_table import TRACEBACK_KEY, profile_row


@pytest.mark.parametrize("error, expected", [
    (torch.OutOfMemoryError("CUDA out of memory"), "oom"),
    (dist.DistBackendError("NCCL error: Cuda failure 'out of memory'"), "oom"),
    (dist.DistBackendError("Connection closed by peer"), "infrastructure"),
    (TimeoutError("collective timed out"), "infrastructure"),
    (ConnectionResetError("peer reset"), "infrastructure"),
    (FileNotFoundError("no images under /data/my-images"), "user_code"),
    (ValueError("out of memory, says the user's message"), "user_code"),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), "user_code"),
    (UserCodeError("workload 'x': model_fn() raised ImportError: no"), "user_code"),
])
def test_a_workers_exception_is_sorted_into_one_class(error, expected):
    assert classify(error) == expected
    assert is_out_of_memory(error) is (expected == "oom")


def test_gloos_lost_peer_is_the_infrastructures_though_a_plain_runtime_error():
    """gloo reports a peer that died as a plain RuntimeError raised by the collective call
    (seen in the killed-worker search test): sorted by where it was raised and its text."""
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection "
                        "closed by peer [127.0.0.1]:18055")
    assert classify(gloo) == "infrastructure"
    namespace: dict = {}
    exec(compile("def all_reduce():\n    raise RuntimeError('peer went away')\n",
                 "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
                 "exec"), namespace)
    with pytest.raises(RuntimeError) as info:
        namespace["all_reduce"]()
    assert classify(info.value) == "infrastructure"  # raised inside torch.distributed
    with pytest.raises(RuntimeError) as mine:
        raise RuntimeError("peer went away")  # the same text, raised by the user's code
    assert classify(mine.value) == "user_code"


def test_workload_code_names_the_stage_and_keeps_the_traceback():
    def load():
        raise FileNotFoundError("no images under /data/my-images")

    with pytest.raises(UserCodeError) as info:
        with workload_code("my-images", "train_dataset_fn()"):
            load()
    error = info.value
    assert error.message == ("workload 'my-images': train_dataset_fn() raised "
                             "FileNotFoundError: no images under /data/my-images")
    assert "in load" in error.traceback_text and isinstance(error.__cause__, FileNotFoundError)
    again = pickle.loads(pickle.dumps(error))  # how Ray brings it to the driver
    assert (again.message, again.traceback_text) == (error.message, error.traceback_text)
    for passes in (torch.OutOfMemoryError("out of memory"), dist.DistBackendError("peer lost")):
        with pytest.raises(type(passes)):
            with workload_code("my-images", "a step"):
                raise passes


def _record(errors, failure, error, launch, candidate, traceback_text="Traceback ..."):
    record_error(errors, failure=failure, error=error, traceback_text=traceback_text,
                 launch=launch, candidate=candidate)


def test_the_record_names_each_distinct_error_once_and_decides_which_ends_a_search():
    errors: list = []
    _record(errors, "infrastructure", "DistBackendError: peer lost", (1, 2), (2, 64))
    _record(errors, "infrastructure", "DistBackendError: peer lost", (1, 2), (2, 128))
    assert len(errors) == 1 and errors[0]["candidates"] == [[2, 64], [2, 128]]
    assert deciding_error(errors) is None  # one launch: a one-off
    _record(errors, "oom", "OutOfMemoryError: CUDA", (2, 1), (1, 256))
    _record(errors, "oom", "OutOfMemoryError: CUDA", (3, 2), (2, 512))
    assert deciding_error(errors) is None  # out of memory moves the bound, never ends it
    _record(errors, "infrastructure", "the cluster holds 1 workers", (2, 4), (4, 64), "")
    _record(errors, "infrastructure", "the cluster holds 1 workers", (3, 4), (4, 32), "")
    assert deciding_error(errors) is None  # found without launching: goes on with other N
    _record(errors, "infrastructure", "DistBackendError: peer lost", (2, 2), (2, 32))
    assert deciding_error(errors)["error"] == "DistBackendError: peer lost"  # twice: the same
    _record(errors, "user_code", "workload 'x': a step raised ValueError: bad", (4, 1), (1, 32))
    assert deciding_error(errors)["failure"] == "user_code"  # first, whatever came before
    report = describe_errors(errors)
    assert report.count("DistBackendError: peer lost") == 1
    assert "infrastructure error on N=2 B=64, N=2 B=128, N=2 B=32" in report


def _failing(n_b_fail, row_of_failure):
    def outcome(n, b):
        if (n, b) in n_b_fail:
            return {**row_of_failure(n, b), TRACEBACK_KEY: f"Traceback (N={n}) ..."}
        return ok_row(n, b)
    return outcome


def test_the_searcher_ends_at_the_workloads_own_error_instead_of_moving_inward():
    def user_code(n, b):
        return profile_row(n, b, status="error", failure="user_code",
                           error="workload 'x': training at B=256 raised ValueError: bad")
    searcher = TulaSearcher(SPACE.candidates(), "partial", {"middle": False})  # the corners
    trials = run(searcher, _failing({(1, 256)}, user_code))
    assert pairs(trials) == [(1, 32), (1, 256)]  # N = 4 and the inward batch never launched
    assert searcher.suggest("again") == Searcher.FINISHED
    assert "stopped by this error (user_code) on 1 candidates" in searcher.stop_reason
    assert searcher.deciding_error["traceback"] == "Traceback (N=1) ..."


def test_the_searcher_goes_on_after_a_one_off_and_ends_at_the_same_error_twice():
    def lost(n, b):
        return profile_row(n, b, status="error", failure="infrastructure",
                           error="DistBackendError: Connection closed by peer")
    searcher = TulaSearcher(SPACE.candidates(), "partial")
    trials = run(searcher, _failing({(1, 256)}, lost))
    assert (1, 128) in pairs(trials)  # a one-off: partial search moved inward
    assert searcher.deciding_error is None and len(searcher.errors) == 1
    searcher = TulaSearcher(SPACE.candidates(), "partial")
    run(searcher, _failing({(1, 256), (4, 256)}, lost))
    assert searcher.deciding_error["launches"] == [[1, 1], [1, 4]]
    assert searcher.stop_reason.startswith("stopped by this error (infrastructure) on 2 cand")
