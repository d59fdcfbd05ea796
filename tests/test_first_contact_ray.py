"""Issue 22 on local Ray, with Workloads defined here as a user would: a dataset only the
driver can read, a model that fails only inside the profiling worker groups, and an error
that ends two launches the same way. Each fails the search with its cause and the
worker's traceback, in the search's one taxonomy of failures (tula_ray.failures)."""

import logging
import os
import sys
import time

import pytest
import torch
import torch.distributed as dist
from ray import cloudpickle  # Ray serialises functions with its own copy
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray.failures import UserCodeError
from tula_ray.runs.search_experiment import saved_search
from tula_ray.space import SearchSpace
from tula_ray.workloads import Workload

pytestmark = pytest.mark.ray

# Ray workers cannot import this test module: its functions travel by value, as a
# driver script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DRIVER_PID = os.getpid()
QUICK = dict(warmup_steps=1, measure_steps=2, measure_seconds=0.2, min_batch=32, max_batch=128,
             cluster_sizes=(1, 2), search_strategy="partial", training_strategy=None,
             strategy_options={"middle": False})  # the paper's corners: a known failure order


def model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 4))


def images() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn((512, 3, 8, 8), generator=generator),
                         torch.randint(0, 4, (512,), generator=generator))


def images_only_the_driver_reads() -> TensorDataset:
    """A path on the driver's disk only: every other process fails to read it."""
    if os.getpid() != DRIVER_PID:
        raise FileNotFoundError("no images under /data/my-images")
    return images()


class FailsInWorkerGroups(nn.Module):
    """Passes the check (a Ray task, no process group) and fails in the profiling worker
    groups (Ray Train sets up a process group, one worker included) at local batches of
    at least 64: the error seen only once the search has launched workers."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and inputs.shape[0] >= 64:
            raise self.error
        return inputs


def test_a_dataset_only_the_driver_reads_fails_the_search_in_seconds_with_its_cause(
        ray_session, tmp_path):
    """Issue 22: the cause in the message (it used to take 72 s and 4 trials and to end
    with "no usable profile rows"), before any trial starts. Its goal in seconds (60) is
    `python -m benchmarks first-contact`'s: a timed assertion fails on a loaded machine."""
    workload = Workload("my-images", model, images_only_the_driver_reads)
    started = time.monotonic()
    with pytest.raises(UserCodeError) as info:
        tula_ray.search(workload, storage_path=str(tmp_path), **QUICK)
    print(f"failed in {time.monotonic() - started:.1f} s")
    error = info.value
    assert error.message == ("workload 'my-images': train_dataset_fn() raised "
                             "FileNotFoundError: no images under /data/my-images")
    assert "in images_only_the_driver_reads" in error.traceback_text  # the worker's traceback
    assert not list(tmp_path.iterdir())  # before any trial


def test_the_workloads_own_code_failing_while_profiling_ends_the_search(ray_session, tmp_path):
    """A user-code failure in a worker group ends the search at once instead of moving
    inward, with the worker's traceback; the rows measured so far stay in the experiment."""
    error = ValueError("my layer cannot take 64 samples")
    workload = Workload("fails-large", lambda: nn.Sequential(FailsInWorkerGroups(error),
                                                              model()), images)
    with pytest.raises(UserCodeError) as info:
        tula_ray.search(workload, storage_path=str(tmp_path), name="user-code", **QUICK)
    message = str(info.value)
    assert ("workload 'fails-large': training at B=128 on N=1 workers raised ValueError: "
            "my layer cannot take 64 samples") in message
    assert "the search stopped" in message and str(tmp_path / "user-code") in message
    assert "in forward" in info.value.traceback_text and "raise self.error" in message
    saved = saved_search(str(tmp_path / "user-code"))
    rows = {(r["num_workers"], r["global_batch"]): r for r in saved.profiles}
    assert rows[(1, 32)]["status"] == "ok"
    assert rows[(1, 128)]["status"] == "error" and rows[(1, 128)]["failure"] == "user_code"
    assert {n for n, _ in rows} == {1}  # N = 2 was never launched: it would fail the same
    assert saved.deciding_error["candidates"] == [[1, 128]]


def test_the_same_error_ending_two_launches_ends_the_search(ray_session, tmp_path):
    """An error of the infrastructure's class (here torch.distributed's) that ends two
    launches the same way would end every one: the search stops with it."""
    error = dist.DistBackendError("simulated collective failure")
    workload = Workload("fails-twice", lambda: nn.Sequential(FailsInWorkerGroups(error),
                                                              model()), images)
    with pytest.raises(UserCodeError, match="DistBackendError: simulated collective failure "
                                            r"\(on N=1 B=128, N=2 B=128\); the search stopped"):
        tula_ray.search(workload, storage_path=str(tmp_path), name="twice", **QUICK)
    saved = saved_search(str(tmp_path / "twice"))
    failed = [r for r in saved.profiles if r["status"] == "error"]
    assert {r["failure"] for r in failed} == {"infrastructure"} and len(failed) == 2
    assert [entry["launches"] for entry in saved.errors] == [[[1, 1], [1, 2]]]


class TakesAtMost(nn.Module):
    """A forward that asserts its batch (issue 41, item 4); the check's 2 samples pass."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs.shape[0] > self.most:  # a user's assert (pytest would rewrite its text)
            raise AssertionError(f"this model takes at most {self.most} samples")
        return inputs


def taking_at_most(most: int) -> Workload:
    return Workload(f"at-most-{most}", lambda: nn.Sequential(TakesAtMost(most), model()), images)


ROOMY_DEVICE_BYTES = 1e12  # memory never binds: the model's own limit does


def test_a_models_own_batch_limit_bounds_the_search_below_it(ray_session, caplog):
    """Issue 41, item 4: the user's 8000-sample search (N in {1, 2}, B up to 4096) with a
    forward asserting b <= 256: the probe stops at the largest candidate's local batch
    (4096, not 8000), takes the refusal as a bound and finds 256 among the candidates,
    warning with the max_batch that skips the check; no argument changed."""
    from trainables.memory_probe import check_max_local_batch, probe_memory

    candidates = SearchSpace.build((1, 2), min_batch=32, max_batch=8000)
    started = time.monotonic()
    probe = probe_memory(taking_at_most(256), {}, min_local_batch=16, resources={"CPU": 1.0},
                         use_gpu=False)
    with caplog.at_level(logging.WARNING, logger="tula_ray.planning.bounds"):
        bounded = check_max_local_batch(probe, ROOMY_DEVICE_BYTES, headroom=0.1,
                                        space=candidates, resources={"CPU": 1.0},
                                        use_gpu=False)
    print(f"probe start to bound: {time.monotonic() - started:.1f} s")
    assert bounded.max_local_batch == 256
    limit = bounded.batch_limit
    assert limit.local_batch == 512 and limit.error == (
        "workload 'at-most-256': memory probe at local batch 512 raised AssertionError: this "
        "model takes at most 256 samples")
    assert [c["local_batch"] for c in bounded.bound_checks] == [256]  # 4096, 512 refused
    assert "pass max_batch=256 (local batch 256 x N=1) to skip this check" in caplog.text


@pytest.mark.parametrize("most, message", [
    (8, "workload 'at-most-8': memory probe at local batch 16 raised AssertionError"),
    (20, "memory probe at local batch 32 raised AssertionError: this model takes at most 20 "
         "samples, while local batch 16 ran: the memory probe needs two batches")])
def test_a_model_refusing_the_probes_batches_is_a_user_code_error(ray_session, most, message):
    """Failing at the probe's smallest batch (or at all but one) leaves nothing to fit
    eq. 3 on: a UserCodeError naming the stage and the batch, not a RayTaskError."""
    from trainables.memory_probe import probe_memory

    with pytest.raises(UserCodeError, match=message):
        probe_memory(taking_at_most(most), {}, min_local_batch=16, resources={"CPU": 1.0},
                     use_gpu=False)
