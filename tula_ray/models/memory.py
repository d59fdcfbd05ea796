"""Memory model (paper §III-A1, eq. 3): M = M_param + M_grad + M_opt + M_act + M_batch.

The static terms come from the model and optimizer themselves; the terms that
grow with the local batch b are fitted from >= 2 measured peaks (CUDA's
max_memory_reserved on GPU, a tensor-allocation tracker on CPU). The plan reads a
b's peak from the monotone curve through the measured points (`predict_peak_bytes`),
not from the line, which, fitted at small b, under-predicts large ones.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from tula_ray.arguments import check_int
from tula_ray.models.peak_curve import curve_peak_bytes

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PROBE_BATCH_FACTORS = (1, 2, 4)  # probe local batches: two identify eq. 3, the third checks it
# Keep this share of the device free: allocator fragmentation and the model's
# own error (the paper reports 8-14 % median memory error, §IV-C3).
HEADROOM_DEFAULT = 0.1
# NCCL's communicator buffers on each GPU, which the probe (one process, no process
# group) never allocates: NCCL_BUFFSIZE (4 MiB by default) per channel, for a send
# and a receive side, over up to 16 ring channels on an intra-node/Ethernet setup
# such as the paper's (NCCL docs, "Environment Variables"). An estimate: check it on
# the first GPU run (README's GPU checklist: nvidia-smi during a 2-worker step). The
# profiling sweep measures them on each worker group around an all-reduce of DDP's bucket
# (`measure.collective_buffer_bytes`, the row's nccl_buffer_bytes), which replaces this
# constant in the row's check; it stands where nothing was measured (the search's budget).
NCCL_BUFFER_BYTES_DEFAULT = 2 * 16 * 4 * 2**20


@dataclass(frozen=True)
class StaticMemory:
    """Eq. 3, the batch-independent terms, in bytes."""

    param_bytes: int  # M_param
    grad_bytes: int  # M_grad: one gradient per trainable parameter
    optimizer_bytes: int  # M_opt: momentum buffers, Adam moments, ...

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


def tensor_bytes(value) -> int:
    """Bytes of the tensors in `value`, a tensor or dicts and lists nesting them."""
    if hasattr(value, "element_size"):  # a tensor (torch is imported only where it is needed)
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def static_memory(
    model: torch.nn.Module,
    optimizer_factory: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
) -> StaticMemory:
    """M_param + M_grad + M_opt of `model` trained by the optimizer `optimizer_factory` builds.

    The optimizer state is measured, not looked up: one step on a copy of the
    model with zero gradients materialises whatever state the optimizer keeps.
    """
    import torch  # here: the rest of this module (eq. 3) is plain numpy

    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = gradient_bytes(model)
    replica = copy.deepcopy(model)
    trainable = [p for p in replica.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer = optimizer_factory(trainable)
    optimizer.step()
    optimizer_bytes = sum(tensor_bytes(state) for state in optimizer.state.values())
    return StaticMemory(param_bytes, grad_bytes, optimizer_bytes)


def gradient_bytes(model: torch.nn.Module) -> int:
    """M_grad: one gradient per trainable parameter; also the size of DDP's gradient
    buckets (`gradient_as_bucket_view=False`, its default: a second copy)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


CURVE_FIELDS = ("curve_batches", "curve_peaks")


@dataclass(frozen=True)
class MemoryParams:
    """Eq. 3 with the batch-dependent terms linear in the local batch b, and the measured
    (b, peak) points that `predict_peak_bytes` reads in place of the line (issue 46)."""

    static_bytes: float  # M_param + M_grad + M_opt
    overhead_bytes: float  # fitted batch-independent extra (allocator, workspace); may be < 0
    activation_bytes_per_sample: float  # M_act / b
    batch_bytes_per_sample: float  # M_batch / b: the input tensors themselves
    # The measured points, b ascending, one peak per b (`with_curve`); empty: the line
    # alone, as in every plan saved before the curve, which then prices as it did.
    curve_batches: tuple[float, ...] = ()
    curve_peaks: tuple[float, ...] = ()

    @property
    def bytes_per_sample(self) -> float:
        return self.activation_bytes_per_sample + self.batch_bytes_per_sample

    def to_dict(self) -> dict[str, float | list[float]]:
        return {k: list(v) if k in CURVE_FIELDS else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, float | list[float]]) -> "MemoryParams":
        curve = {k: tuple(float(x) for x in data.get(k, ())) for k in CURVE_FIELDS}
        return cls(**{k: float(v) for k, v in data.items() if k not in CURVE_FIELDS}, **curve)


def with_curve(params: MemoryParams, points: Iterable[tuple[float, float]]) -> MemoryParams:
    """`params` with the measured (b, peak) `points` as its curve (`predict_peak_bytes`):
    sorted by b, the largest peak where a b was measured twice."""
    peaks: dict[float, float] = {}
    for b, peak in points:
        peaks[float(b)] = max(float(peak), peaks.get(float(b), -np.inf))
    if len(peaks) < 2:
        raise ValueError(f"a memory curve needs peaks at >= 2 distinct local batch sizes; "
                         f"got {sorted(peaks)}")
    batches = tuple(sorted(peaks))
    return replace(params, curve_batches=batches, curve_peaks=tuple(peaks[b] for b in batches))


def fit(
    local_batches: Iterable[float],
    peak_bytes: Iterable[float],
    *,
    static_bytes: float = 0.0,
    batch_bytes_per_sample: float = 0.0,
) -> MemoryParams:
    """Fit the batch-dependent terms of eq. 3 from measured peaks at >= 2 local batch sizes."""
    b = np.asarray(list(local_batches), dtype=float)
    peak = np.asarray(list(peak_bytes), dtype=float)
    if len(b) != len(peak):
        raise ValueError(f"{len(b)} local batch sizes but {len(peak)} peaks; give one peak each")
    if len(np.unique(b)) < 2:
        raise ValueError(f"the memory model needs peaks at >= 2 distinct local batch sizes; "
                         f"got {sorted(set(b.tolist()))}")
    if not np.all(np.isfinite(peak)) or np.any(peak <= 0):
        raise ValueError(f"peak memory must be positive and finite; got {peak.tolist()}")
    slope, intercept = np.polyfit(b, peak - static_bytes, 1)
    if slope < 0:
        logger.warning("measured peak memory falls with the batch (slope %.3g B/sample): "
                       "taking it as flat", slope)
        slope, intercept = 0.0, float(np.mean(peak - static_bytes))
    return MemoryParams(
        static_bytes=float(static_bytes),
        overhead_bytes=float(intercept),
        activation_bytes_per_sample=float(max(slope - batch_bytes_per_sample, 0.0)),
        batch_bytes_per_sample=float(min(batch_bytes_per_sample, slope)),
    )


def predict_peak_bytes(params: MemoryParams, local_batch) -> np.ndarray:
    """Predicted peak memory of one worker at local batch b: the curve through the
    measured points (`curve_peak_bytes`) where `params` has one, else eq. 3's line."""
    if params.curve_batches:
        return curve_peak_bytes(params.curve_batches, params.curve_peaks, local_batch)
    return line_peak_bytes(params, local_batch)


def line_peak_bytes(params: MemoryParams, local_batch) -> np.ndarray:
    """Eq. 3: the fitted line's peak memory of one worker at local batch b."""
    b = np.asarray(local_batch, dtype=float)
    return params.static_bytes + params.overhead_bytes + params.bytes_per_sample * b


def probe_batches(min_local_batch: int) -> list[int]:
    """The local batches the memory probe measures: min_local_batch x PROBE_BATCH_FACTORS."""
    return [min_local_batch * factor for factor in PROBE_BATCH_FACTORS]


def peak_rows(params: MemoryParams, points: Iterable[tuple[int, float]]) -> list[dict]:
    """One row per measured (local batch, peak) with eq. 3's line beside it (the curve
    passes through the points: beside them it would say nothing)."""
    points = list(points)
    predicted = line_peak_bytes(params, [b for b, _ in points])
    return [{"local_batch": b, "peak_mem_bytes": peak, "predicted_peak_mem_bytes": float(q)}
            for (b, peak), q in zip(points, predicted)]


def fit_probe(points: Iterable[tuple[int, float]], static: StaticMemory,
              input_bytes_per_sample: float) -> MemoryParams:
    """Eq. 3 from the probe's (local batch, peak) points: the static terms measured on the
    model and optimizer (`static_memory`), M_batch from the input size, M_act fitted; and
    the curve through the points (`with_curve`), which the plan's peaks are read from."""
    points = list(points)
    line = fit([b for b, _ in points], [peak for _, peak in points],
               static_bytes=static.total_bytes, batch_bytes_per_sample=input_bytes_per_sample)
    return with_curve(line, points)


def device_budget_bytes(device_bytes: float, *, grad_bytes: float, num_workers: int,
                        in_use_bytes: float = 0.0, nccl: bool = False,
                        nccl_buffer_bytes: float | None = None,
                        strategy_state_bytes: float = 0.0) -> float:
    """Bytes of one device that eq. 3's M_total may take in a job of `num_workers` workers.

    The probe measures one process training the bare model on a device it has to
    itself, so three costs of the real job are invisible to it and are taken off here:
    - in_use_bytes: memory already taken on the device before the model (on a GPU the
      CUDA context, a few hundred MB, and anything another process holds: total minus
      free as `torch.cuda.mem_get_info` reports it once the context exists);
    - DDP's gradient buckets when N >= 2: DDP all-reduces flat bucket tensors that are a
      second copy of every gradient (`gradient_as_bucket_view=False`, its default), so
      `grad_bytes` more;
    - NCCL's communicator buffers when N >= 2 on NCCL: `nccl_buffer_bytes` as measured
      (a profile row's), `NCCL_BUFFER_BYTES_DEFAULT` when None (nothing measured yet);
    - strategy_state_bytes: the state the training strategy's optimizer keeps beyond the
      workload's (the probe steps the workload's optimizer, `train` the strategy's).
    Allocator fragmentation stays in `max_local_batch`'s headroom.
    Raises ValueError when these alone exceed the device.
    """
    if nccl_buffer_bytes is None:
        nccl_buffer_bytes = NCCL_BUFFER_BYTES_DEFAULT
    if not device_bytes > 0:
        raise ValueError(f"device_bytes={device_bytes!r}; it must be positive")
    check_int("num_workers", num_workers, minimum=1)
    for name, value in (("grad_bytes", grad_bytes), ("in_use_bytes", in_use_bytes),
                        ("nccl_buffer_bytes", nccl_buffer_bytes),
                        ("strategy_state_bytes", strategy_state_bytes)):
        if not value >= 0:
            raise ValueError(f"{name}={value!r}; it must be >= 0")
    data_parallel = num_workers >= 2
    budget = (device_bytes - in_use_bytes - (grad_bytes if data_parallel else 0.0)
              - (nccl_buffer_bytes if data_parallel and nccl else 0.0) - strategy_state_bytes)
    if budget <= 0:
        raise ValueError(
            f"nothing is left for training on a device of {device_bytes / 1e9:.3g} GB: "
            f"{in_use_bytes / 1e9:.3g} GB already in use"
            + (f", DDP buckets {grad_bytes / 1e9:.3g} GB" if data_parallel else "")
            + (f", NCCL buffers {nccl_buffer_bytes / 1e9:.3g} GB" if data_parallel and nccl
               else "")
            + (f", the training strategy's optimizer state {strategy_state_bytes / 1e9:.3g} GB"
               if strategy_state_bytes else "") + "; free the device or use a larger one")
    return float(budget)


def budget_peak_bytes(measured_peak_bytes: float, *, bucket_bytes: float = 0.0,
                      nccl_buffer_bytes: float | None = None,
                      resident_bytes: float = 0.0) -> float:
    """The part of a data-parallel worker's measured peak that a budget from
    `device_budget_bytes` is to hold, each cost counted once. That budget already took
    off DDP's gradient buckets and NCCL's buffers (`NCCL_BUFFER_BYTES_DEFAULT`), so:
    - bucket_bytes: the buckets, when the measured peak holds them too (CUDA's
      max_memory_allocated does; MemTracker, watching the bare module, does not), are
      taken off it;
    - nccl_buffer_bytes: NCCL's buffers as measured on this worker group (no peak counter
      sees them): what they take beyond the budgeted constant is added, what they take
      less is taken off; None (not measured: CPU, N = 1) leaves the constant standing;
    - resident_bytes: the dataset the data path keeps on the device, which the budget took
      off as in use (`measure.probe_peaks`'s device_in_use_bytes) and CUDA's peak holds
      too: taken off it (counted twice, it made false "oom" rows near the bound).
    """
    for name, value in (("measured_peak_bytes", measured_peak_bytes),
                        ("bucket_bytes", bucket_bytes), ("resident_bytes", resident_bytes)):
        if not value >= 0:
            raise ValueError(f"{name}={value!r}; it must be >= 0")
    nccl_excess = 0.0 if nccl_buffer_bytes is None or np.isnan(nccl_buffer_bytes) \
        else float(nccl_buffer_bytes) - NCCL_BUFFER_BYTES_DEFAULT
    return float(measured_peak_bytes) - float(bucket_bytes) - float(resident_bytes) + nccl_excess


def over_budget(measured_peak_bytes: float, budget_bytes: float, *, bucket_bytes: float = 0.0,
                nccl_buffer_bytes: float | None = None, resident_bytes: float = 0.0) -> str:
    """Why a profiled row does not fit the budget (its error text), "" when it does: the
    peak counted as `budget_peak_bytes` counts it, against `budget_bytes`."""
    counted = budget_peak_bytes(measured_peak_bytes, bucket_bytes=bucket_bytes,
                                nccl_buffer_bytes=nccl_buffer_bytes,
                                resident_bytes=resident_bytes)
    if counted <= float(budget_bytes):
        return ""
    parts = [f"peak {measured_peak_bytes:.4g} bytes"]
    if bucket_bytes:
        parts.append(f"less DDP's buckets {bucket_bytes:.4g} (budgeted apart)")
    if resident_bytes:
        parts.append(f"less the dataset on the device {resident_bytes:.4g} (budgeted apart)")
    nccl_excess = counted - measured_peak_bytes + bucket_bytes + resident_bytes
    if nccl_excess:
        parts.append(f"plus NCCL's buffers beyond the budgeted {NCCL_BUFFER_BYTES_DEFAULT:.4g}:"
                     f" {nccl_excess:.4g}")
    return f"{', '.join(parts)} = {counted:.4g} > device_memory_bytes {float(budget_bytes):.4g}"


def max_local_batch(params: MemoryParams, device_bytes: float,
                    headroom: float = HEADROOM_DEFAULT) -> int:
    """Largest local batch b whose peak on eq. 3's line fits device_bytes * (1 - headroom);
    0 if none (the start of the CPU probe's bound check, `verified_max_local_batch`)."""
    if not device_bytes > 0:
        raise ValueError(f"device_bytes={device_bytes!r}; it must be positive")
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom={headroom!r}; it must be within [0, 1)")
    if params.bytes_per_sample <= 0:
        raise ValueError("peak memory does not grow with the batch in these measurements, so "
                         "no batch bound can be derived from memory; give max_batch instead")
    budget = device_bytes * (1.0 - headroom) - params.static_bytes - params.overhead_bytes
    b = int(np.floor(budget / params.bytes_per_sample))
    # Float rounding at the boundary: make predict(b) <= budget < predict(b + 1) exact.
    limit = device_bytes * (1.0 - headroom)
    while b > 0 and line_peak_bytes(params, b) > limit:
        b -= 1
    while line_peak_bytes(params, b + 1) <= limit:
        b += 1
    return max(b, 0)


MAX_BOUND_CHECKS_DEFAULT = 3  # measurements near the bound; each is one probe step at large b
BOUND_TOLERANCE = 0.05  # stop once a secant step would raise the verified bound by less than 5 %
SECANT_AIM_MARGIN = 1e-9  # the secant aims this fraction under the limit (float rounding)


def verified_max_local_batch(
    params: MemoryParams,
    measure_peak: Callable[[int], float | None],
    device_bytes: float,
    *,
    headroom: float = HEADROOM_DEFAULT,
    measured: Iterable[tuple[int, float]] = (),
    cap: int | None = None,
    max_checks: int = MAX_BOUND_CHECKS_DEFAULT,
) -> tuple[int, list[tuple[int, float | None]]]:
    """`max_local_batch`, checked by measuring the peak at the bound it predicts.

    Eq. 3 is linear in b, but a probe at small b can sit where the optimizer step's peak
    dominates and the activations are still small: its slope then underestimates the
    growth at large b and the bound overshoots (resnet18 on CPU here: 1867 predicted,
    1135 true). Each check measures the predicted bound; the next prediction is the
    secant through the two largest measured batches, the regime near the bound.

    measure_peak(b): peak bytes at local batch b, or None when b ran out of memory.
    measured: (b, peak) pairs already known (the probe's). cap: no candidate needs a
    larger local batch, so nothing above it is measured.
    Returns (bound, checks): the largest checked b whose peak fits, or the model's bound
    when no check was needed (it is not above a batch already measured to fit, or the
    cap); checks lists each (b, peak or None) measured here.
    """
    limit = device_bytes * (1.0 - headroom)
    peaks: dict[int, float | None] = {int(b): p for b, p in measured}
    candidate = max_local_batch(params, device_bytes, headroom)
    checks: list[tuple[int, float | None]] = []
    for _ in range(max_checks):
        fits = max((b for b, p in peaks.items() if p is not None and p <= limit), default=0)
        over = min((b for b, p in peaks.items() if p is None or p > limit), default=None)
        if cap is not None:
            candidate = min(candidate, cap)
        if over is not None:
            candidate = min(candidate, over - 1)
        if candidate <= fits or (checks and candidate <= fits * (1 + BOUND_TOLERANCE)
                                 and checks[-1][0] == fits):
            break
        peak = measure_peak(candidate)
        checks.append((candidate, peak))
        peaks[candidate] = peak
        if candidate == cap and peak is not None and peak <= limit:
            break
        candidate = _secant_bound(peaks, limit, candidate)
    if not checks:
        return candidate, checks
    # A batch is only checked above every batch known to fit, so the largest fitting one
    # is a check when any check fitted, else the largest measured batch that fits.
    return max((b for b, p in peaks.items() if p is not None and p <= limit), default=0), checks


def _secant_bound(peaks: dict[int, float | None], limit: float, last: int) -> int:
    """Next bound guess: where the line through the two largest measured batches reaches
    `limit`; after an out-of-memory (no peak), halfway down from `last`."""
    known = sorted((b, p) for b, p in peaks.items() if p is not None)
    if peaks[last] is None or len(known) < 2:
        fits = max((b for b, p in known if p <= limit), default=0)
        return (fits + last) // 2
    (b1, p1), (b2, p2) = known[-2:]
    slope = (p2 - p1) / (b2 - b1)
    if slope <= 0:
        return last  # flat near the bound: nothing better to aim at
    bound = int(np.floor(b2 + (limit - p2) / slope))
    # Rounding can land the floor on a b whose peak on the line is a hair over the limit,
    # and a b exactly on the limit is over it after rounding as often as under it (a check
    # wasted on it: hypothesis found 6000 at 1 + 1e-16 of the limit, bound 5310 for 5999):
    # aim just under the limit.
    aim = limit * (1.0 - SECANT_AIM_MARGIN)
    while bound > 0 and p2 + slope * (bound - b2) > aim:
        bound -= 1
    return bound
