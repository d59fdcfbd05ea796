"""The workers of a profiled batch agree at the end of every phase whether it succeeded
(issue 26, item 2): a failure on any rank stops every rank at the same point, each with
the same class in the search's one taxonomy (`tula_ray.failures`), instead of the others
waiting in the next collective until the process-group timeout and the row reading
"error" where a peer ran out of memory.

One small all-reduce per phase, the MAX of a failure code (0 when the phase succeeded
here), on a gloo side group (`tula_ray.distributed.side_group`): it never pairs with a
collective of the default group. When a rank fails inside a step whose collective its
peers then wait in (DDP's all-reduce, a strategy's), the peers would wait for their
device behind it; so the timed blocks agree once more between queuing their steps and
that wait (`before_wait`, issue 46): the failing rank's agreement meets its peers' there,
every rank raises at once, and the peers abort the default group's collectives in flight
(`tula_ray.distributed.abort_collectives`), which frees their devices. A peer blocked
before that point (its host waiting on the device inside a step) cannot come: the
agreement times out after `AGREEMENT_TIMEOUT_S`, well under the trial's collective
timeout, and the failing rank raises its own error, which the driver sorts
(`trainables.profiling_trial.describe_failure` puts out of memory before a peer's
collective error). No Ray here (core module).
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from typing import Any, Callable, TypeVar

import torch

from tula_ray.distributed import (abort_collectives, gathered_objects, max_over_ranks,
                                  side_group)
from tula_ray.failures import UserCodeError, classify
from tula_ray.profile_table import FAILURE_INFRASTRUCTURE, FAILURE_OOM, FAILURE_USER_CODE

logger = logging.getLogger(__name__)

Result = TypeVar("Result")

# A phase's failure code; the MAX over the ranks wins, so every rank takes the class that
# says most, in `describe_failure`'s order: the workload's code, then out of memory, then
# the rest (a peer's collective error is a consequence).
FAILURE_CODES = {FAILURE_INFRASTRUCTURE: 1, FAILURE_OOM: 2, FAILURE_USER_CODE: 3}
# How long a rank waits at a phase's end for its peers: they do at most the rest of one
# phase (a second or so of steps, an evaluation probe, a checkpoint write) before they
# come; a rank still missing then is waiting in a collective for this one.
AGREEMENT_TIMEOUT_S = 60.0


class PeerOutOfMemoryError(torch.OutOfMemoryError):
    """Another worker of the group ran out of memory at this batch."""


class PeerFailureError(ConnectionError):
    """Another worker of the group failed at this batch, outside the workload's code and
    not out of memory (infrastructure, as `tula_ray.failures.classify` reads it)."""


class PhaseAgreement:
    """Runs the phases of a profiled batch, each ended by the ranks' agreement.

    >>> agreement = PhaseAgreement(device)   # every rank, at the same point
    >>> seconds = agreement.run("synced steps", lambda: time_block(...))
    """

    def __init__(self, device: torch.device | str, timeout_s: float = AGREEMENT_TIMEOUT_S,
                 process_group: Any = None) -> None:
        self.device = torch.device(device)
        self.group = process_group if process_group is not None else side_group(timeout_s)
        self.phases: list[str] = []  # every phase agreed on, in order (what tests read)
        # What `before_wait`'s agreement raised: agreed on already, `run` raises it as is.
        self.agreed_failure: Exception | None = None

    def run(self, phase: str, work: Callable[[], Result],
            inside: contextlib.AbstractContextManager | None = None) -> Result:
        """`work()` (inside `inside`, e.g. DDP's no_sync), then the agreement: its result
        when every rank succeeded; otherwise every rank raises, with the same class."""
        failure: Exception | None = None
        result: Any = None
        try:
            with inside if inside is not None else contextlib.nullcontext():
                result = work()
        except Exception as error:  # noqa: BLE001 - agreed on, then raised again
            if error is self.agreed_failure:
                raise
            failure = error
            if classify(error) == FAILURE_OOM and self.device.type == "cuda":
                torch.cuda.empty_cache()  # room for the agreement and the peers' report
        self.agree(phase, failure)
        return result

    def before_wait(self, phase: str) -> Callable[[], None]:
        """The agreement of a `phase` whose work queues collectives on the device and
        then waits for it (`step_timing.time_block`'s `before_wait`), taken once this
        rank queued its steps: a peer whose step failed as it was queued (out of memory)
        meets it from `run`, and this rank raises that peer's error at once, without
        waiting for a device held by a collective that the peer never joined. The
        collectives this rank left in flight are aborted (`abort_collectives`): the
        worker group ends after a failed batch."""
        def agree_queued() -> None:
            try:
                self._settle(phase, None)
            except Exception as error:
                self.phases.append(phase)  # the phase ends here: `run` agrees no more
                abort_collectives()
                self.agreed_failure = error
                raise
        return agree_queued

    def agree(self, phase: str, failure: Exception | None) -> None:
        """Raise on every rank when `failure` (this rank's, None when the phase succeeded
        here) or a peer's is not None: this rank's own error when it has the agreed class,
        else one of that class naming the peer (`peer_error`)."""
        self.phases.append(phase)
        self._settle(phase, failure)

    def _settle(self, phase: str, failure: Exception | None) -> None:
        """`agree`'s exchange with the peers, and what it raises."""
        code = FAILURE_CODES[classify(failure)] if failure is not None else 0
        try:
            (worst,) = max_over_ranks([float(code)], "cpu", self.group)
            if not worst:
                return
            reports = gathered_objects(None if failure is None else _report(failure),
                                       self.group)
        except Exception:  # noqa: BLE001 - a peer never came: it waits in a collective
            if failure is None:
                raise
            logger.warning("phase %r: the other workers did not come to the agreement "
                           "(they wait in a collective for this one)", phase)
            raise failure from None
        if failure is not None and code == worst:
            raise failure
        rank, report = next((rank, report) for rank, report in enumerate(reports)
                            if report is not None and FAILURE_CODES[report[0]] == worst)
        raise peer_error(phase, rank, *report)


def _report(failure: BaseException) -> tuple[str, str, str]:
    """(class, "Type: message", traceback) of this rank's failure, for its peers."""
    if isinstance(failure, UserCodeError):
        return FAILURE_USER_CODE, failure.message, failure.traceback_text
    return (classify(failure), f"{type(failure).__name__}: {failure}",
            "".join(traceback.format_exception(failure)))


def peer_error(phase: str, rank: int, failure: str, message: str,
               traceback_text: str) -> Exception:
    """The error a rank raises for rank `rank`'s `failure` in `phase`: of the same class."""
    where = f"worker {rank} failed in the {phase} phase: {message}"
    if failure == FAILURE_OOM:
        return PeerOutOfMemoryError(f"out of memory on another worker of this group ({where})")
    if failure == FAILURE_USER_CODE:
        return UserCodeError(message, traceback_text)
    return PeerFailureError(where)
