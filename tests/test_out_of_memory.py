"""Out of memory on some ranks only, and NCCL's own allocation failure (issue 14, item 6),
with injected exceptions: every worker labels the batch "oom" together, within seconds,
instead of some waiting in a collective until the process-group timeout; a profiling
trial's process group gives up after minutes, not torch's default half hour."""


import itertools
import json
import os
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from benchmarks.common import spawn_gloo
from gloo_scenarios import run_scenarios
from trainables.profiling_trial import COLLECTIVE_TIMEOUT_S, build_trainer
from tula_ray.cluster import WORKER_GROUP_START_RETRIES
from tula_ray.failures import classify, is_out_of_memory, workload_code
from tula_ray.training.phase_agreement import PeerOutOfMemoryError, PhaseAgreement
from tula_ray.training.profile_phases import agree_first_step_fits

NCCL_OOM = ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call "
            "to CUDA function failed.\nLast error:\nCuda failure 'out of memory'")


# A CUDA library's device allocation failing, as torch raises it: a plain RuntimeError (an
# AcceleratorError for the CUDA runtime's own), not torch.OutOfMemoryError (issue 46).
CUBLAS_OOM = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
LIBRARY_OOMS = [
    CUBLAS_OOM,
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmulAlgoGetHeuristic( "
    "ltHandle, computeDesc.descriptor(), Adesc.descriptor(), Bdesc.descriptor(), ...)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",  # cuDNN 9's name
    "cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
    "cuFFT error: CUFFT_ALLOC_FAILED",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
    "other API call, so the stacktrace below might be incorrect.",
]
NCCL_SYSTEM_OOM = ("NCCL error in: ProcessGroupNCCL.cpp:2027, unhandled system error (run "
                   "with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclSystemError: "
                   "System call (e.g. socket, malloc) or external library call failed or "
                   "device error.\nLast error:\nCuda failure 2 'out of memory'")


@pytest.mark.parametrize("text", LIBRARY_OOMS)
def test_a_cuda_librarys_allocation_failure_is_out_of_memory_not_user_code(text):
    for error in (RuntimeError(text), torch.AcceleratorError(text)):
        assert is_out_of_memory(error) and classify(error) == "oom"
    with pytest.raises(RuntimeError):  # it leaves the workload's code as it is
        with workload_code("cnn", "training at B=4096 on N=1 workers"):
            raise RuntimeError(text)
    assert is_out_of_memory(f"ray.exceptions.RayTaskError(RuntimeError): {text}")


@pytest.mark.parametrize("error, oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (dist.DistBackendError(NCCL_OOM), True),
    (dist.DistBackendError(NCCL_SYSTEM_OOM), True),
    (dist.DistBackendError("NCCL WARN Cuda failure 'CUDA_ERROR_OUT_OF_MEMORY'"), True),
    (RuntimeError("Failed to CUDA calloc async 4096 bytes"), True),
    # Host memory and other library statuses are not the device running out.
    (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"), False),
    (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), False),
    (RuntimeError("CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasSgemm( "
                  "handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`"), False),
    ("ray.exceptions.RayTaskError(OutOfMemoryError): worker 1 ...", True),  # Ray's text
    (dist.DistBackendError("[Gloo] Timed out waiting 180000ms for recv operation"), False),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 6x8)"), False),
    (ValueError("max_batch=4096 is out of memory range"), False),  # not a device failure
])
def test_out_of_memory_is_recognised_however_it_is_raised(error, oom):
    assert is_out_of_memory(error) is oom


def _rank(rank: int, directory: str, failing_rank: int, error_text: str) -> None:
    def step() -> list[float]:
        if rank == failing_rank:  # injected: this worker's allocation fails
            raise dist.DistBackendError(error_text) if "NCCL" in error_text \
                else torch.OutOfMemoryError(error_text)
        return [0.01]

    try:
        agree_first_step_fits(step, torch.device("cpu"), torch.no_grad())
        outcome = "fitted"
    except RuntimeError as exc:  # a rank left waiting would get the group's timeout here
        outcome = type(exc).__name__ if is_out_of_memory(exc) else "other"
    with open(f"{directory}/{rank}.txt", "w") as handle:
        handle.write(outcome)


ONE_RANK_FAILS = [
    (1, "CUDA out of memory. Tried to allocate 1.00 GiB"),
    (0, NCCL_OOM),
]
# (failing rank, its error) of every test below, -1: none fails. All run on one pair of
# gloo ranks, which import torch and this module (Ray's among its imports) once, not once
# per test.
SCENARIOS = [(-1, ""), *ONE_RANK_FAILS]


def _every_scenario_rank(rank: int, directory: str) -> None:
    run_scenarios(rank, directory, [(_rank, *scenario) for scenario in SCENARIOS])


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[int, str], dict[int, str]]:
    """Per scenario, what each rank concluded."""
    directory = tmp_path_factory.mktemp("out-of-memory")
    for index in range(len(SCENARIOS)):
        (directory / str(index)).mkdir()
    # A short process-group timeout: a rank left waiting in a collective fails fast with a
    # timeout error ("other" below) instead of hanging the test for torch's 30 minutes.
    spawn_gloo(_every_scenario_rank, 2, str(directory), timeout_s=30)
    return {scenario: {rank: (directory / str(index) / f"{rank}.txt").read_text()
                       for rank in (0, 1)} for index, scenario in enumerate(SCENARIOS)}


@pytest.mark.parametrize("failing_rank, error_text", ONE_RANK_FAILS)
def test_an_oom_on_one_rank_is_an_oom_on_every_rank_at_once(outcomes, failing_rank, error_text):
    outcome = outcomes[(failing_rank, error_text)]
    expected_failing = "DistBackendError" if "NCCL" in error_text else "OutOfMemoryError"
    assert outcome[failing_rank] == expected_failing
    assert outcome[1 - failing_rank] == PeerOutOfMemoryError.__name__


def test_every_rank_fitting_returns_the_step_timing(outcomes):
    assert [outcomes[(-1, "")][rank] for rank in (0, 1)] == ["fitted", "fitted"]


def test_a_profiling_trial_gives_up_on_a_lost_peer_or_a_group_that_cannot_start(monkeypatch):
    import trainables.profiling_trial as trial

    built = {}
    monkeypatch.setattr(trial, "TorchTrainer", lambda loop, **kwargs: built.update(kwargs))
    build_trainer({"num_workers": 2, "global_batches": [32], "use_gpu": False,
                   "resources_per_worker": {"CPU": 1}, "workload": "fashion-mnist-cnn"})
    assert built["torch_config"].timeout_s == COLLECTIVE_TIMEOUT_S
    assert COLLECTIVE_TIMEOUT_S <= 300 < 1800  # torch's default: half an hour
    # A group that keeps failing to start gives up too (Ray Train's default: retry forever).
    assert 0 <= built["run_config"].failure_config.controller_failure_limit \
        == trial.PROFILING_START_RETRIES < WORKER_GROUP_START_RETRIES


def test_the_memory_probe_reads_a_cublas_allocation_failure_as_out_of_memory(monkeypatch):
    """The probe's check near the bound (one Ray task's body, `_peak_on_worker`): a step
    whose cuBLAS handle cannot be allocated is a batch that does not fit (None), not the
    workload's own code refusing it (a UserCodeError, which ended the probe in the driver
    at its smallest batch and read as the model's own limit above it)."""
    from types import SimpleNamespace

    import trainables.memory_probe as memory_probe
    from tula_ray.training import measure

    def step_peak(workload, local_batch, **kwargs):  # the fake step: cuBLAS fails above 64
        if local_batch > 64:
            raise RuntimeError(CUBLAS_OOM)
        return 1000 * local_batch

    monkeypatch.setattr(measure, "peak_memory_bytes", step_peak)
    workload = SimpleNamespace(name="fake-cnn")
    assert memory_probe._peak_on_worker(workload, 64, False, None) == 64_000
    assert memory_probe._peak_on_worker(workload, 128, False, None) is None


# One rank out of memory in a synced step on a GPU (issue 46): the peers' hosts queue the
# step's gradient all-reduce (NCCL's, asynchronous to the host) and go on, then wait for the
# device at the block's end, behind the all-reduce the failing rank never joined. Without
# the agreement before that wait, the failing rank waited AGREEMENT_TIMEOUT_S (60 s) and the
# peers until the group's timeout, and their rows read "error".
FAILING_RANK = 1
SYNCED_GROUP_TIMEOUT_S = 45  # the group's: a peer left waiting ends after it, too late
BOTH_END_S = 30


class _QueuedDevice:
    """A stand-in for a GPU under NCCL, on gloo: a step queues its gradient all-reduce and
    goes on (`all_reduce`); the block's wait for the device (`step_timing.synchronize`)
    waits for every queued one."""

    def __init__(self) -> None:
        self.queued: list = []

    def all_reduce(self) -> None:
        self.queued.append(dist.all_reduce(torch.ones(4), async_op=True))

    def wait(self, device) -> None:
        while self.queued:
            self.queued.pop(0).wait()


def _synced_step_rank(rank: int, directory: str) -> None:
    import tula_ray.training.step_timing as step_timing
    from tula_ray.training.profile_phases import synced_block
    from tula_ray.training.profile_sweep import profile_batch

    device = _QueuedDevice()
    step_timing.synchronize = device.wait  # this spawned process's only
    training = SimpleNamespace(agreement=PhaseAgreement("cpu"), device=torch.device("cpu"),
                               transition=0)
    steps = itertools.count()

    def run_step() -> None:  # FAILING_RANK's third step runs out as it allocates
        if rank == FAILING_RANK and next(steps) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        device.all_reduce()

    sweep = SimpleNamespace(world_size=2, num_nodes=1, workload=SimpleNamespace(name="fake"),
                            profile=lambda _: {"step_time_s": sum(synced_block(
                                training, run_step, 4)) / 4})
    started = time.perf_counter()
    row = profile_batch(sweep, 64)
    with open(f"{directory}/{rank}.json", "w") as handle:
        json.dump({"status": row["status"], "failure": row["failure"], "error": row["error"],
                   "seconds": time.perf_counter() - started,
                   "phases": training.agreement.phases}, handle)
    # The peer's all-reduce is still queued on the default group: no collective after it.
    os._exit(0)


def test_one_ranks_oom_in_a_synced_step_ends_both_ranks_at_once_as_oom(tmp_path):
    spawn_gloo(_synced_step_rank, 2, str(tmp_path), timeout_s=SYNCED_GROUP_TIMEOUT_S)
    rows = {rank: json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)}
    for rank, row in rows.items():
        assert (row["status"], row["failure"]) == ("oom", "oom"), (rank, row)
        assert row["seconds"] < BOTH_END_S, (rank, row)
        assert row["phases"] == ["synced steps"], (rank, row)  # one agreement ended it
    assert rows[FAILING_RANK]["error"].startswith("OutOfMemoryError")
    assert rows[1 - FAILING_RANK]["error"].startswith(PeerOutOfMemoryError.__name__)
