"""The model's own limit on the local batch (issue 41, item 4): a batch its code refuses.

A model may take batches of at most some size (an assert in its forward, a buffer of a
fixed size). Once a smaller batch ran, the memory probe takes a batch the workload's own
code fails at as it takes one that runs out of memory: as a bound, not as the end of the
search. `checked_max_local_batch` runs the memory bound check
(`memory.verified_max_local_batch`) and, once the code has refused a batch, bisects the
candidates' local batches between the largest that ran and fitted and the smallest that
did not: a few more probe steps, and the search goes on below the limit. On a GPU,
`measured_max_local_batch` finds the bound by measuring alone (`bound_search`), a
refused batch failing there as one out of memory does. Core: no Ray.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping

from tula_ray.failures import UserCodeError
from tula_ray.models.bound_search import measured_bound
from tula_ray.models.memory import HEADROOM_DEFAULT, MemoryParams, verified_max_local_batch


@dataclass(frozen=True)
class BatchLimit:
    """The smallest local batch the workload's own code failed at, and what it raised."""

    local_batch: int  # the smallest local batch the workload's code refused
    error: str  # the UserCodeError's message: the workload, the stage, the batch, the error

    def reason(self) -> str:
        """The plan's infeasible_reason of a candidate at or above the limit."""
        return f"above the model's own batch limit (b={self.local_batch}): {self.error}"

    def warning(self, bound: int, smallest_workers: int) -> str:
        """What the search logs: the limit, where it searches, and how to skip the check."""
        return (f"{self.error}, while a smaller local batch ran: taken as the model's own "
                f"batch limit, the search goes on below it (local batch <= {bound}). If "
                f"that is the model's limit, pass max_batch={bound * smallest_workers} "
                f"(local batch {bound} x N={smallest_workers}) to skip this check")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BatchLimit":
        return cls(int(data["local_batch"]), str(data["error"]))


class _Refused(Exception):
    """The workload's code failed at the measured batch: leave the secant search."""


Check = tuple[int, float | None]  # (local batch, peak bytes or None: out of memory)


def checked_max_local_batch(
    params: MemoryParams,
    measure_peak: Callable[[int], float | None],
    device_bytes: float,
    *,
    local_batches: Iterable[int],
    headroom: float = HEADROOM_DEFAULT,
    measured: Iterable[tuple[int, float]] = (),
    refused: Mapping[int, str] | None = None,
) -> tuple[int, list[Check], BatchLimit | None]:
    """The largest local batch that fits the device and that the model runs.

    measure_peak(b): peak bytes at local batch b, None when b ran out of memory; raises
    UserCodeError when the workload's own code fails at b. local_batches: the candidates'
    (nothing above the largest is measured). measured: (b, peak) the probe measured;
    refused: {b: message} where the probe's own steps failed (`measure.probe_peaks`).
    Without a refusal this is `memory.verified_max_local_batch` with the largest
    candidate as its cap. After one, the candidates strictly between the largest batch
    known to fit and the smallest known not to (refused, out of memory, or over the
    device) are bisected, each one step measured. Returns (bound, checks, limit): checks
    lists each (b, peak or None) measured here; limit is None when nothing was refused.
    """
    local_batches = sorted(set(local_batches))
    refusals = dict(refused or {})
    checks: list[Check] = []

    def measure(b: int) -> float | None:
        try:
            peak = measure_peak(b)
        except UserCodeError as error:
            refusals[b] = error.message
            raise _Refused from None
        checks.append((b, peak))
        return peak

    measured = list(measured)
    if not refusals:
        try:
            bound, _ = verified_max_local_batch(
                params, measure, device_bytes, headroom=headroom, measured=measured,
                cap=local_batches[-1])
            return bound, checks, None
        except _Refused:
            pass
    bound = _bisect(measure, device_bytes * (1.0 - headroom), local_batches,
                    [*measured, *checks], refusals)
    smallest = min(refusals)
    return bound, checks, BatchLimit(smallest, refusals[smallest])


def _bisect(measure: Callable[[int], float | None], limit_bytes: float,
            local_batches: list[int], known: list[Check], refusals: Mapping[int, str]) -> int:
    """The largest of `local_batches` measured to fit `limit_bytes` and to run, bisecting
    those between the largest known to (0 if none) and the smallest known not to."""
    def fits(peak: float | None) -> bool:
        return peak is not None and peak <= limit_bytes

    largest_fit = max((b for b, peak in known if fits(peak)), default=0)
    smallest_over = min([*refusals, *(b for b, peak in known if not fits(peak))])
    inside = [b for b in local_batches if largest_fit < b < smallest_over]
    while inside:
        b = inside[len(inside) // 2]
        try:
            peak = measure(b)
        except _Refused:
            peak = None
        if fits(peak):
            largest_fit, inside = b, [x for x in inside if x > b]
        else:
            inside = [x for x in inside if x < b]
    return largest_fit


def measured_max_local_batch(
    measure_peak: Callable[[int], float | None],
    device_bytes: float,
    *,
    local_batches: Iterable[int],
    headroom: float = HEADROOM_DEFAULT,
    measured: Iterable[tuple[int, float]] = (),
    refused: Mapping[int, str] | None = None,
) -> tuple[int, list[Check], BatchLimit | None]:
    """`checked_max_local_batch` found by measuring (`bound_search.measured_bound`: the
    probe's largest fitting batch doubled until a step fails, then bisected to within 5 %),
    up to the largest of `local_batches`; no eq. 3 line is extrapolated. A batch the
    workload's code refuses (measure_peak raises UserCodeError) fails as one out of memory
    does, and the smallest refused is the model's own limit. Returns (bound, checks, limit)
    as `checked_max_local_batch` does (a refused batch has no peak to list)."""
    refusals = dict(refused or {})

    def measure(b: int) -> float | None:
        try:
            return measure_peak(b)
        except UserCodeError as error:
            refusals[b] = error.message
            return None

    known = [*measured, *((b, None) for b in refusals)]
    bound, tries = measured_bound(measure, device_bytes * (1.0 - headroom),
                                  cap=max(local_batches), measured=known)
    checks = [(b, peak) for b, peak in tries if b not in refusals]
    if not refusals:
        return bound, checks, None
    smallest = min(refusals)
    return bound, checks, BatchLimit(smallest, refusals[smallest])
