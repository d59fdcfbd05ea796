"""The memory bound found by measuring (issue 46, item 2): double the local batch until a
step runs out of memory (or over the budget, or at the cap), then bisect between the last
batch that fitted and the first that did not, to within `BOUND_TOLERANCE`.

On an H100, eq. 3's line fitted at b <= 16 under-predicted large batches by 4-59 %, so a
bound extrapolated from it and checked a few times could collapse far below the true
one. Measured, the bound is a batch that ran: never above the true bound, and within 5 %
of it. Core: no Ray, no torch (an out-of-memory error is told apart by
`failures.is_out_of_memory`).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from tula_ray.arguments import check_int, check_number
from tula_ray.failures import is_out_of_memory

BOUND_TOLERANCE = 0.05  # the bound found is at least (1 - this) x the true bound

Try = tuple[int, float | None]  # (local batch, peak bytes; None: out of memory)


def peak_or_none(step: Callable[[int], float], local_batch: int, *,
                 after_out_of_memory: Callable[[], object] | None = None) -> float | None:
    """`step(local_batch)`'s peak bytes; None when it ran out of memory (the one place a
    try's out-of-memory error is caught, as `failures.is_out_of_memory` reads it; anything
    else is raised). after_out_of_memory: run once it did (CUDA: give the cache back)."""
    try:
        return step(local_batch)
    except RuntimeError as error:  # torch.OutOfMemoryError, cuBLAS's or NCCL's allocation
        if not is_out_of_memory(error):
            raise
    if after_out_of_memory is not None:
        after_out_of_memory()
    return None


def most_tries(start: int, cap: int, tolerance: float = BOUND_TOLERANCE) -> int:
    """The most tries `measured_bound` makes from a largest known fitting batch `start`
    (>= 1) up to `cap`: ceil(log2(cap / start)) doublings, then at most
    ceil(log2(1 / tolerance)) + 1 bisections (the gap starts at most at the batch that
    fitted and halves each try; one more for rounding to whole batches)."""
    doublings = math.ceil(math.log2(cap / start)) if cap > start else 0
    return doublings + math.ceil(math.log2(1 / tolerance)) + 1


def measured_bound(measure_peak: Callable[[int], float | None], limit_bytes: float, *,
                   cap: int, measured: Iterable[Try] = (),
                   tolerance: float = BOUND_TOLERANCE) -> tuple[int, list[Try]]:
    """The largest local batch measured to fit `limit_bytes`, within `tolerance` of the
    largest that does, found by measuring: doubling, then bisection.

    measure_peak(b): the peak bytes of a real step at b (forward, backward, optimizer
    step), None when it ran out of memory (`peak_or_none`). A try fits when its peak is
    at most `limit_bytes`. measured: (b, peak) already known (the probe's points; None
    for a batch known to fail). cap: nothing above it is tried (no candidate needs more).
    Peaks are taken to grow with b, so the true bound T lies between the largest batch
    known to fit and the smallest known not to. From the largest fitting batch b0 (1 when
    none is known), b doubles until a try fails or the cap is reached; then the gap is
    bisected until the batch that fits is at least (1 - tolerance) x the one below the
    batch that failed. Tries: at most `most_tries(b0, cap)` (a bound 1000x the probe's
    largest batch: 10 doublings and at most 6 bisections); none when the cap is known to
    fit. Returns (bound, tries): bound <= T and >= (1 - tolerance) x T (0 when not even
    b = 1 fits), tries each (b, peak or None) measured here, in order.
    """
    check_int("cap", cap, minimum=1)
    check_number("tolerance", tolerance, low=0, high=1, low_open=True, high_open=True)
    peaks = dict(measured)
    tries: list[Try] = []

    def fits(b: int) -> bool:
        if b not in peaks:
            peaks[b] = measure_peak(b)
            tries.append((b, peaks[b]))
        return peaks[b] is not None and peaks[b] <= limit_bytes

    failing = [b for b in peaks if not fits(b)]
    high = min([*failing, cap + 1])  # the smallest known not to fit (cap + 1: none known)
    low = max((b for b in peaks if b < high and fits(b)), default=0)
    while high > cap and low < cap:  # doubling: no failing batch known below the cap
        b = min(max(2 * low, 1), cap)
        low, high = (b, high) if fits(b) else (low, b)
    while low < (1 - tolerance) * (high - 1):  # bisection: low fits, high does not
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, tries
