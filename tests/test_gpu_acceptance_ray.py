"""`python -m benchmarks gpu-acceptance --quick --allow-cpu`'s Ray half where Ray is
importable, on a tiny synthetic workload (issue 26, item 7). The command's Ray-free half
runs in `test_benchmarks_quick` (in a child process without Ray); here the Ray half runs
in this process, on the run's shared Ray, and its report is the command's."""

import pytest
import torch
from result_checks import table_rows

pytestmark = pytest.mark.ray


def test_gpu_acceptance_runs_its_ray_half_where_ray_is_importable(ray_session):
    """The search run twice (per B: both runs' times, agreement within the spread, the
    clock flag), `train` against the plan's epoch time, bf16 skipped on the CPU; NCCL's check
    is the Ray-free half's now (issue 46: one rank's OOM in a synced step)."""
    from benchmarks.gpu import acceptance
    from benchmarks.gpu.acceptance_ray import ray_half

    ray = ray_half(True, torch.device("cpu"))
    assert "error" not in ray, ray.get("error")
    result = {"provenance": {"command": "-", "commit": "-", "date": "-"},
              "environment": acceptance.environment(torch.device("cpu")),
              "halves": ["Ray-free", "Ray"], "out_of_memory": "-", "data_paths": [],
              "rows": [], "ray": ray}
    markdown = acceptance.report(result)  # the command's report, with its Ray half
    assert "the Ray-free and Ray halves ran" in markdown and "Ray importable: True" in markdown
    twice = table_rows(markdown, "| workload | B | step ms |")
    assert twice and all(row[0] == "cnn" for row in twice)
    for row in twice:
        first, second = (float(ms) for ms in row[2].split(" / "))
        assert first > 0 and second > 0
        assert row[6] in ("yes", "no") and row[7] in ("ok", "not ramped up")
    (train,) = table_rows(markdown, "| workload | train |")
    assert train[1].startswith("N=1 B=")
    assert len(train[3].split(" / ")) == 2  # two epochs' seconds
    assert 0 < float(train[4]) < 10  # the plan's epoch time over the measured one
    assert len(train) == 6 and train[5].startswith("skipped")  # bf16: no GPU here
    assert "NCCL error path" not in markdown  # two ranks on one GPU: NCCL's refusal only
