"""One taxonomy of failures, used by the whole search (issue 22, item 3).

  out of memory    the device ran out: the candidate is infeasible and the memory bound
                   falls (the search goes on, inward);
  user code        the workload's own code raised (its dataset, model, loss or optimizer),
                   or the same error ended two launches: it would fail every candidate the
                   same way, so the search ends with that error and its traceback;
  infrastructure   a worker or node lost, a placement or a collective that timed out: the
                   candidate is an error row and the search goes on.

The workers sort their own exceptions (`workload_code`): an exception raised inside the
workload's code reaches the driver as a `UserCodeError` that carries the worker's
traceback; torch.distributed's, connection and time-out errors stay what they are. The
searcher keeps one record per distinct error (`record_error`, JSON) and asks
`deciding_error` whether one of them ends the search; `describe_errors` names each once.
The class names are the profile table's (`tula_ray.profile_table.FAILURES`).

Core module: no Ray; torch is imported by the functions that need it, so that the
`tula-ray` command can name a UserCodeError without importing torch at start-up.
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any, Iterator

from tula_ray.profile_table import FAILURE_INFRASTRUCTURE, FAILURE_OOM, FAILURE_USER_CODE

SAME_ERROR_LAUNCHES = 2  # an error that ended this many launches is the workload's own
# How an allocation failure reads when it does not arrive as torch.OutOfMemoryError (lower
# case): a CUDA error raised as a plain RuntimeError ("CUDA error: out of memory"); NCCL's
# own (a DistBackendError: "Cuda failure 'out of memory'", "Failed to CUDA calloc", the
# driver API's CUDA_ERROR_OUT_OF_MEMORY); a CUDA library whose device allocation failed
# (torch raises their status as a RuntimeError: "CUDA error: CUBLAS_STATUS_ALLOC_FAILED
# when calling `cublasCreate(handle)`", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", cuDNN 9's
# CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, cuSOLVER's, cuSPARSE's, cuFFT's);
# or a worker's error passed on as text by Ray.
OUT_OF_MEMORY_TEXTS = ("outofmemoryerror", "out of memory", "failed to cuda calloc",
                       "cudaerrormemoryallocation", "cuda_error_out_of_memory",
                       "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                       "cudnn_status_internal_error_device_allocation_failed",
                       "cusolver_status_alloc_failed", "cusparse_status_alloc_failed",
                       "cufft_alloc_failed")
# Where collectives live (an error whose innermost frame is there came from one), and how
# the backends name themselves in the errors they raise as plain RuntimeErrors.
COLLECTIVE_CODE = ("torch/distributed/", "torch/nn/parallel/")
COLLECTIVE_TEXTS = ("gloo", "nccl", "c10d", "connection closed by peer")


def is_out_of_memory(error: BaseException | str) -> bool:
    """True when `error` (an exception, or its text) is a device running out of memory."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    if isinstance(error, BaseException) and not isinstance(error, RuntimeError):
        return False  # e.g. a ValueError that quotes "out of memory" in a message
    text = (error if isinstance(error, str) else f"{type(error).__name__}: {error}").lower()
    return any(pattern in text for pattern in OUT_OF_MEMORY_TEXTS)


def classify(error: BaseException) -> str:
    """The class of an exception raised in a worker: FAILURE_OOM, FAILURE_USER_CODE for one
    the workload's code raised (or already sorted as such), else FAILURE_INFRASTRUCTURE:
    what the machinery around the workload's code raises, never the code itself
    (`raised_by_a_collective`; the network, time-outs)."""
    if is_out_of_memory(error):
        return FAILURE_OOM
    if isinstance(error, UserCodeError):
        return FAILURE_USER_CODE
    if isinstance(error, (ConnectionError, TimeoutError)) or raised_by_a_collective(error):
        return FAILURE_INFRASTRUCTURE
    return FAILURE_USER_CODE


def raised_by_a_collective(error: BaseException) -> bool:
    """Whether torch.distributed raised `error`: its DistError types (NCCL's, time-outs);
    or an error whose innermost Python frame is in torch.distributed or DDP (gloo reports a
    lost peer as a plain RuntimeError from the collective call); or one that names a
    backend (DDP's gradient all-reduce fails inside the C++ autograd engine, below any
    Python frame of torch.distributed)."""
    import torch.distributed as dist

    if isinstance(error, dist.DistError):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    if frames and any(place in frames[-1].filename.replace("\\", "/")
                      for place in COLLECTIVE_CODE):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(name in text for name in COLLECTIVE_TEXTS)


class UserCodeError(Exception):
    """The workload's own code raised: what it raised, where, and the traceback from the
    process it ran in (a Ray worker's traceback does not travel with a re-raised exception).

    `str()` is the message followed by that traceback; `.message` is the message alone."""

    def __init__(self, message: str, traceback_text: str = "") -> None:
        super().__init__(message)
        self.message, self.traceback_text = message, traceback_text

    @classmethod
    def raised_by(cls, workload: str, stage: str, error: BaseException) -> "UserCodeError":
        """What `stage` of workload `workload` raised, with this process's traceback."""
        return cls(f"workload {workload!r}: {stage} raised {type(error).__name__}: {error}",
                   "".join(traceback.format_exception(error)))

    def __str__(self) -> str:
        if not self.traceback_text:
            return self.message
        return f"{self.message}\nTraceback where it ran:\n{self.traceback_text.rstrip()}"

    def __reduce__(self) -> tuple:  # pickled by Ray from a worker to the driver
        return type(self), (self.message, self.traceback_text)


@contextlib.contextmanager
def workload_code(workload: str, stage: str) -> Iterator[None]:
    """Run a stage of the workload's own code: an exception of the user-code class leaves
    as a UserCodeError naming the workload and the stage; out of memory and
    infrastructure errors leave as they are."""
    try:
        yield
    except UserCodeError:
        raise
    except Exception as error:  # noqa: BLE001 - sorted, then raised again
        if classify(error) != FAILURE_USER_CODE:
            raise
        raise UserCodeError.raised_by(workload, stage, error) from error


# --------------------------------------------------------------------------- the search's record

def record_error(errors: list[dict[str, Any]], *, failure: str, error: str, traceback_text: str,
                 launch: tuple[int, int], candidate: tuple[int, int]) -> None:
    """Add one failed candidate to `errors` (JSON: one entry per distinct failure class
    and error text, with the launches (round, N) and candidates (N, B) it ended)."""
    for entry in errors:
        if entry["failure"] == failure and entry["error"] == error:
            break
    else:
        entry = {"failure": failure, "error": error, "traceback": traceback_text,
                 "launches": [], "candidates": []}
        errors.append(entry)
    if list(launch) not in entry["launches"]:
        entry["launches"].append(list(launch))
    if list(candidate) not in entry["candidates"]:
        entry["candidates"].append(list(candidate))
    entry["traceback"] = entry["traceback"] or traceback_text


def deciding_error(errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The error that ends a search, or None: the first from the workload's code, else the
    first raised in workers (it has a traceback) that ended `SAME_ERROR_LAUNCHES` launches
    the same way. Out-of-memory errors never end a search, nor errors found without
    launching (a node that cannot be placed: the search goes on with the others)."""
    for entry in errors:
        if entry["failure"] == FAILURE_USER_CODE:
            return entry
    for entry in errors:
        if (entry["failure"] != FAILURE_OOM and entry["traceback"]
                and len(entry["launches"]) >= SAME_ERROR_LAUNCHES):
            return entry
    return None


def describe_errors(errors: list[dict[str, Any]]) -> str:
    """Each distinct error once, with the candidates it hit and its traceback."""
    lines = []
    for entry in errors:
        where = ", ".join(f"N={n} B={b}" for n, b in entry["candidates"])
        lines.append(f"{entry['failure']} error on {where}: {entry['error']}")
        if entry["traceback"]:
            lines += ["  " + line for line in entry["traceback"].rstrip().splitlines()]
    return "\n".join(lines)
