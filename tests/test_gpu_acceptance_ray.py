"""`python -m benchmarks gpu-acceptance --quick --allow-cpu` where Ray is importable: both
halves run, the Ray half on a tiny synthetic workload (issue 26, item 7)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from result_checks import table_rows

from benchmarks.common import RESULTS_DIR
from tula_ray.cluster import ADDRESS_ENV

pytestmark = pytest.mark.ray


def test_gpu_acceptance_runs_its_ray_half_where_ray_is_importable(ray_session):
    """The search run twice (per B: both runs' times, agreement within the spread, the
    clock flag), `train` against the plan's epoch time, bf16 skipped on the CPU; NCCL's check
    is the Ray-free half's now (issue 46: one rank's OOM in a synced step).
    In a child process, as the command runs, joining the run's shared Ray (RAY_ADDRESS)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks", "gpu-acceptance", "--quick",
                           "--allow-cpu"], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=600,
                          env={**os.environ, ADDRESS_ENV: ray_session})
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (RESULTS_DIR / "gpu_acceptance_quick.md").read_text()
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
    assert "- One rank out of memory in a synced step (gloo ranks" in markdown
