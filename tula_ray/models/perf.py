"""Parallel performance model: per-step time = compute(b) + sync(N) (paper §III-A2).

Fitted from profile rows (see `tula_ray.profile_table`); predicts the step time and
the training time of every (N, B). Fitting is separate from predicting, and both
are pure functions of arrays (the shape of AdaptDL's goodput model).

Refinements over the paper, each measured on real hardware (NOTES-ENV), each
reducing to the paper's form when the data do:
- the compute curve belongs to the worker's resources, so it is fitted per
  cluster size N where the profiles allow it (on a shared CPU machine, N
  workers split the cores; on a GPU cluster the curves coincide), and
  interpolated in log2(N) for cluster sizes never profiled;
- compute is linear in b with a fixed per-step cost (eq. 2b) unless the data
  are convex (larger batches spill out of cache: on 2 CPU cores a step costs
  b^1.12), then a power law a * b^p: the forms of `tula_ray.models.compute_forms`, where
  a user registers another;
- sync has two levels (issue 26): an all-reduce within a node (NVLink, shared memory)
  and one across nodes (the network), each in ring all-reduce's alpha-beta form,
  alpha * hops(n) + beta * units(n) over the n workers (or nodes) of that level; a
  cluster size spans `topology.nodes_for(N, G)` nodes. On one node, with no latency
  term, this is the paper's units(N) * beta;
- exposed sync time changes with b: max(0, levels + units(N) * beta1 * b). beta1 > 0
  where it grows (stragglers; on CPU the collective competes with compute for the
  cores), beta1 < 0 where it falls (DDP all-reduces buckets while the backward goes
  on: a longer backward hides more of the same communication);
- DDP overlaps the all-reduce with the backward pass. Besides the paper's
  additive form (eq. 2a) we fit AdaptDL's p-norm overlap form and keep it only
  when its leave-one-out error is lower.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

# ComputeCurve and fit_compute_curve: eq. 2b and its forms, re-exported here.
from tula_ray.models.compute_forms import (ComputeCurve, Curve, curve_from_dict,  # noqa: F401
                                           curve_to_dict, fit_compute_curve)
from tula_ray.models.sync_levels import (COLLECTIVE_HOPS, COLLECTIVES,  # noqa: F401
                                         SyncFit, collective_units, exposed_sync_s,
                                         fit_sync_levels, level_terms, packed_nodes,
                                         parameter_server_units, register_collective,
                                         ring_allreduce_hops, ring_allreduce_units, rows_nodes)
from tula_ray.profile_table import usable

logger = logging.getLogger(__name__)

FORMS = ("auto", "additive", "overlap")
FORM_DEFAULT = "auto"  # the additive form, or overlap where it predicts clearly better
COLLECTIVE_DEFAULT = "ring"  # NCCL's and gloo's all-reduce of DDP's gradient buckets
OVERLAP_P_BOUNDS = (1.0, 10.0)  # p = 1 is additive; p -> inf is perfect overlap (max)
# The overlap form has one more parameter: keep it only when it predicts clearly
# better out of sample, not when it merely fits the noise of one run.
OVERLAP_MIN_GAIN = 0.9  # overlap LOO error must be below 90 % of the additive one


# --- the fitted parameters ----------------------------------------------------

@dataclass(frozen=True)
class PerfParams:
    """The fitted performance model of one workload on one kind of worker."""

    compute: dict[int, Curve]  # eq. 2b per profiled N with >= 2 local batch sizes
    compute_pooled: Curve  # all rows together: used when no per-N curve applies
    # sync time per unit of the collective's shape (eq. 2c) among the workers of one node
    sync_per_unit_s: float
    collective: str  # key of COLLECTIVES
    # change of exposed sync with b: > 0 with stragglers, < 0 where the backward hides it
    sync_per_unit_per_sample_s: float = 0.0
    overlap_p: float = 1.0  # p-norm exponent; 1.0 is the paper's additive eq. 2a
    strategy: str = "full"  # the search strategy that chose the rows it was fitted from
    num_profiles: int = 0
    loo_median_rel_error: float | None = None  # leave-one-out step-time error of this fit
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the topology (issue 26): workers one node holds (None: one node holds every N), the
    # latency per hop within a node, and the network level's two terms (None: no profile
    # spans nodes, so the network is taken as the node's level; `notes` says so)
    workers_per_node: int | None = None
    sync_latency_s: float = 0.0
    inter_sync_per_unit_s: float | None = None
    inter_sync_latency_s: float | None = None

    @property
    def form(self) -> str:
        return "additive" if self.overlap_p == 1.0 else "overlap"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["compute"] = {str(n): curve_to_dict(line) for n, line in self.compute.items()}
        data["compute_pooled"] = curve_to_dict(self.compute_pooled)
        data["notes"] = list(self.notes)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "PerfParams":
        data = dict(data)
        if "mode" in data:  # plans written before the search's `mode` became `strategy`
            data["strategy"] = data.pop("mode")
        data["compute"] = {int(n): curve_from_dict(line) for n, line in data["compute"].items()}
        data["compute_pooled"] = curve_from_dict(data["compute_pooled"])
        data["notes"] = tuple(data.get("notes", ()))
        return cls(**data)


# --- prediction (vectorised) --------------------------------------------------

def predict_compute_s(params: PerfParams, num_workers, local_batch) -> np.ndarray:
    """Eq. 2b: compute time per step of a worker of a cluster of N at local batch b.

    For an N never profiled, the predictions of the nearest profiled cluster
    sizes are interpolated linearly in log2(N) (held constant beyond them).
    """
    n, b = np.broadcast_arrays(
        np.asarray(num_workers, dtype=float), np.asarray(local_batch, dtype=float)
    )
    if not params.compute:
        return params.compute_pooled(b)
    known = np.array(sorted(params.compute), dtype=float)
    at_known = np.stack([params.compute[int(k)](b) for k in known])  # (K, *shape)
    if len(known) == 1:
        return at_known[0]
    x, xk = np.log2(n), np.log2(known)
    upper = np.clip(np.searchsorted(xk, x), 1, len(xk) - 1)
    weight = np.clip((x - xk[upper - 1]) / (xk[upper] - xk[upper - 1]), 0.0, 1.0)
    below = np.take_along_axis(at_known, (upper - 1)[None], axis=0)[0]
    above = np.take_along_axis(at_known, upper[None], axis=0)[0]
    return (1.0 - weight) * below + weight * above


def predict_sync_s(params: PerfParams, num_workers, local_batch=0.0,
                   num_nodes=None) -> np.ndarray:
    """Eq. 2c: exposed sync time per step, the two levels' all-reduces (`level_sync_s`)
    plus a change with b that may rise or fall, never below 0 (module docstring).
    num_nodes: the nodes each N spans; default `topology.nodes_for(N, G)`, G the
    params' workers_per_node."""
    n = np.asarray(num_workers, dtype=float)
    if num_nodes is None:
        num_nodes = packed_nodes(n, params.workers_per_node)
    levels = level_sync_s(params, n, num_nodes)
    units = collective_units(params.collective)(n)
    return exposed_sync_s(levels, units, params.sync_per_unit_per_sample_s, local_batch)


def level_sync_s(params: PerfParams, num_workers, num_nodes) -> np.ndarray:
    """alpha_intra * hops(N / k) + beta_intra * units(N / k) + alpha_inter * hops(k)
    + beta_inter * units(k): ring all-reduce's alpha-beta form per level
    (`tula_ray.models.sync_levels`); the network's terms are the node's where no profile
    spanned nodes."""
    terms = level_terms(params.collective, num_workers, num_nodes)
    inter_beta = (params.sync_per_unit_s if params.inter_sync_per_unit_s is None
                  else params.inter_sync_per_unit_s)
    inter_alpha = (params.sync_latency_s if params.inter_sync_latency_s is None
                   else params.inter_sync_latency_s)
    return (params.sync_latency_s * terms.intra_hops + params.sync_per_unit_s * terms.intra_units
            + inter_alpha * terms.inter_hops + inter_beta * terms.inter_units)


def combine_step_s(compute_s, sync_s, overlap_p: float = 1.0) -> np.ndarray:
    """Eq. 2a, t_step = t_compute + t_sync; with overlap_p > 1, AdaptDL's p-norm
    (t_compute^p + t_sync^p)^(1/p), which models the all-reduce hidden behind backward."""
    compute_s = np.asarray(compute_s, dtype=float)
    sync_s = np.asarray(sync_s, dtype=float)
    if overlap_p == 1.0:
        return compute_s + sync_s
    return (compute_s**overlap_p + sync_s**overlap_p) ** (1.0 / overlap_p)


def predict_step_s(params: PerfParams, num_workers, local_batch, num_nodes=None) -> np.ndarray:
    """Eq. 2a: predicted time of one synchronous data-parallel step."""
    return combine_step_s(
        predict_compute_s(params, num_workers, local_batch),
        predict_sync_s(params, num_workers, local_batch, num_nodes),
        params.overlap_p,
    )


def steps_per_epoch(dataset_size: int, global_batch, whole_steps: bool = True) -> np.ndarray:
    """Eq. 4a's D / B: the steps of one epoch, rounded down as `train` takes them (each
    rank drops its last incomplete batch: floor(floor(D / N) / b) = floor(D / B)), at
    least one. whole_steps=False keeps D / B unrounded: a smooth curve in B, for finding
    its knee (the rounding's sawtooth gives Kneedle a spurious knee at the first ripple)."""
    steps = dataset_size / np.asarray(global_batch, dtype=float)
    return np.maximum(np.floor(steps), 1.0) if whole_steps else steps


def training_time_s(step_time_s, epochs: int, dataset_size: int, global_batch,
                    whole_steps: bool = True) -> np.ndarray:
    """Eq. 4a: T = E * D / B * t_step (D / B: `steps_per_epoch`)."""
    return epochs * steps_per_epoch(dataset_size, global_batch, whole_steps) * np.asarray(
        step_time_s, dtype=float)


# --- fitting ------------------------------------------------------------------

def _fit_compute(rows: pd.DataFrame) -> tuple[dict[int, Curve], Curve]:
    per_n = {
        int(n): fit_compute_curve(group["local_batch"], group["compute_time_s"])
        for n, group in rows.groupby("num_workers")
        if group["local_batch"].nunique() >= 2
    }
    return per_n, fit_compute_curve(rows["local_batch"], rows["compute_time_s"])


def _fit_overlap(params: PerfParams, rows: pd.DataFrame) -> PerfParams:
    """Fit the communication scale (every sync term times f), beta1 and p jointly to the
    measured step times (log residuals)."""
    n = rows["num_workers"].to_numpy(float)
    b = rows["local_batch"].to_numpy(float)
    k = rows_nodes(rows, params.workers_per_node)
    measured = rows["step_time_s"].to_numpy(float)
    compute = predict_compute_s(params, n, b)
    units = collective_units(params.collective)(n)
    if not (level_sync_s(params, n, k) > 0).any():  # nothing to scale: start from a trace
        params = replace(params, sync_per_unit_s=1e-6, inter_sync_per_unit_s=None)
    # theta[0] is the node level's per-unit time (the paper's one coefficient on one node),
    # the other terms scaled with it: the solver works in seconds, as the fit always did.
    reference = params.sync_per_unit_s or 1e-6
    shape = level_sync_s(params, n, k) / reference

    def residuals(theta: np.ndarray) -> np.ndarray:
        step = combine_step_s(compute, exposed_sync_s(theta[0] * shape, units, theta[1], b),
                              theta[2])
        return np.log(np.maximum(step, 1e-12)) - np.log(measured)

    start = np.array([reference * 2.0, params.sync_per_unit_per_sample_s * 2.0, 2.0])
    per_unit, slope, p = least_squares(
        residuals, start, loss="soft_l1",
        bounds=([0.0, -np.inf, OVERLAP_P_BOUNDS[0]], [np.inf, np.inf, OVERLAP_P_BOUNDS[1]]),
    ).x
    scale = per_unit / reference

    def scaled(value: float | None) -> float | None:
        return None if value is None else float(scale * value)

    return replace(params, sync_per_unit_s=scaled(params.sync_per_unit_s),
                   sync_latency_s=scaled(params.sync_latency_s),
                   inter_sync_per_unit_s=scaled(params.inter_sync_per_unit_s),
                   inter_sync_latency_s=scaled(params.inter_sync_latency_s),
                   sync_per_unit_per_sample_s=float(slope), overlap_p=float(p))


def _fit_form(rows: pd.DataFrame, collective: str, form: str, strategy: str,
              workers_per_node: int | None = None) -> PerfParams:
    if rows.empty:
        raise ValueError(
            "no usable profile rows (status 'ok' with a step time) to fit the performance "
            "model; every profiled candidate failed: see the profiles' 'error' column"
        )
    per_n, pooled = _fit_compute(rows)
    sync = fit_sync_levels(rows, collective, workers_per_node, latency=form != "overlap")
    notes: tuple[str, ...] = ()
    if sync is None:
        notes = ("no multi-worker profile: sync time taken as 0 for every N",)
        sync = SyncFit(0.0)
    params = PerfParams(per_n, pooled, sync.intra_per_unit_s, collective,
                        sync.per_unit_per_sample_s, 1.0, strategy, len(rows), None,
                        notes + sync.notes, workers_per_node, sync.intra_latency_s,
                        sync.inter_per_unit_s, sync.inter_latency_s)
    if form == "overlap":
        params = _fit_overlap(params, rows)
    return params


def _loo_error(rows: pd.DataFrame, collective: str, form: str, strategy: str,
               workers_per_node: int | None = None) -> float | None:
    """Median relative error of each row's step time predicted by a fit without it."""
    if len(rows) < 3:
        return None
    nodes = rows_nodes(rows, workers_per_node)
    errors = []
    for i in range(len(rows)):
        rest = rows.drop(index=rows.index[i])
        params = _fit_form(rest, collective, form, strategy, workers_per_node)
        row = rows.iloc[i]
        predicted = float(predict_step_s(params, row["num_workers"], row["local_batch"],
                                         nodes[i]))
        errors.append(abs(predicted - row["step_time_s"]) / row["step_time_s"])
    return float(np.median(errors))


def _enough_for_overlap(rows: pd.DataFrame, collective: str) -> bool:
    units = collective_units(collective)(rows["num_workers"].to_numpy(float))
    return int((units > 0).sum()) >= 5  # three parameters, plus points left to judge them


def fit(
    rows: pd.DataFrame,
    *,
    collective: str = COLLECTIVE_DEFAULT,
    form: str = FORM_DEFAULT,
    strategy: str = "full",
    workers_per_node: int | None = None,
) -> PerfParams:
    """Fit the performance model from profile rows: every usable one it is given (the
    search strategy decides which: `search_strategies.SearchStrategy.fit_rows`).

    collective: a key of COLLECTIVES ("ring", "ps", or one registered).
    form: "additive" (eq. 2a), "overlap" (p-norm), or "auto": overlap only when
      there are enough multi-worker rows and its leave-one-out error is lower.
    strategy: recorded with the parameters (which strategy chose the rows).
    workers_per_node: G, the workers one node holds (`tula_ray.models.topology`): N > G
      spans nodes and its all-reduce has a network level. None: one node holds every N.
    """
    if form not in FORMS:
        raise ValueError(f"form {form!r} is not allowed; use one of {FORMS}")
    collective_units(collective)
    rows = usable(rows)
    candidates = [form] if form != "auto" else ["additive"]
    if form == "auto" and _enough_for_overlap(rows, collective):
        candidates.append("overlap")
    best: PerfParams | None = None
    for name in candidates:
        params = _fit_form(rows, collective, name, strategy, workers_per_node)
        loo = _loo_error(rows, collective, name, strategy, workers_per_node)
        params = replace(params, loo_median_rel_error=loo)
        best_loo = math.inf if best is None or best.loo_median_rel_error is None else best.loo_median_rel_error
        if best is None or (loo is not None and loo < OVERLAP_MIN_GAIN * best_loo):
            best = params
    logger.info("perf model: %s form from %d rows (%s), LOO error %s",
                best.form, best.num_profiles, strategy, best.loo_median_rel_error)
    return best
