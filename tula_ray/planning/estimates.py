"""What the policy chooses on, candidate by candidate (DESIGN step 4, after the fit):
the model's predictions for every (N, B) (eq. 2, 3, 4a, 4b), the estimates that rest on
the measurements where a candidate was profiled, how sure each row is, and the dense
curve the knee is found on. Core module: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Collection

import numpy as np
import pandas as pd

from tula_ray.models import memory as memory_model, perf
from tula_ray.models.pricing import NodeBilling
from tula_ray.planning.target_costs import TargetEvaluations, add_target_extras
from tula_ray.profile_table import STATUS_OK, usable

DENSE_POINTS = 256  # batch sizes on the dense curve the knee is found on
StepExtra = Callable[[np.ndarray], np.ndarray]  # N -> seconds the strategy adds per step
# (N, b) -> seconds: an evaluation pass, a compute cost per sample
BatchCost = Callable[[np.ndarray, np.ndarray], np.ndarray]


def by_nearest_n(profiles: pd.DataFrame, column: str, *, per_worker_share: bool = False
                 ) -> StepExtra | None:
    """`column` as a function of N: per profiled N, the median of its measured values (at
    least 0: these are costs, a negative one is timing noise); at an N not measured, the
    nearest measured N's in log2(N), scaled by N_measured / N when `per_worker_share`
    (work split over the workers: an evaluation pass). None when nothing was measured."""
    if column not in profiles:
        return None
    rows = profiles.dropna(subset=[column])
    if rows.empty:
        return None
    by_n = rows[column].clip(lower=0.0).groupby(rows["num_workers"]).median()
    counts, values = by_n.index.to_numpy(float), by_n.to_numpy(float)

    def at(num_workers: np.ndarray) -> np.ndarray:
        n = np.asarray(num_workers, dtype=float)
        nearest = nearest_measured(n, counts)
        return values[nearest] * (counts[nearest] / n if per_worker_share else 1.0)
    return at


def nearest_measured(num_workers: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The index into `counts` (the measured N) of the nearest to each N, in log2(N)."""
    return np.abs(np.log2(num_workers)[..., None] - np.log2(counts)).argmin(axis=-1)


def evaluation_by_batch(profiles: pd.DataFrame, per_sample: BatchCost | None = None
                        ) -> BatchCost | None:
    """An evaluation pass's seconds at (N, b), from the passes profiled (`eval_time_s`, at
    the local batch of their row) by `by_nearest_n`. per_sample: the compute seconds per
    sample at (N, b) (eq. 2b's curve over b); given, `train` evaluates at the training's
    local batch: where passes were measured at several b of an N (a sweep's smallest and
    largest, since 2026-11-29), between them (`evaluation_between`); else each measured
    pass is counted in units of that cost at its own b and priced at the queried b (a
    CPU's cost per sample rises again at large b: the CNN's pass at B = 2048 took 1.8x
    its pass at B = 32 in train-time's runs). None: the measured pass at every b. None
    when no pass was measured."""
    if "eval_time_s" not in profiles or profiles["eval_time_s"].isna().all():
        return None
    rows = profiles.dropna(subset=["eval_time_s"])
    if per_sample is not None and measured_at_several_batches(rows):
        return evaluation_between(rows)
    if per_sample is None:
        by_n = by_nearest_n(profiles, "eval_time_s", per_worker_share=True)
        return lambda n, b: by_n(n)  # type: ignore[misc]
    unit = np.asarray(per_sample(rows["num_workers"].to_numpy(float),
                                 rows["local_batch"].to_numpy(float)), dtype=float)
    if not np.all(np.isfinite(unit) & (unit > 0)):
        return evaluation_by_batch(profiles)  # a compute curve that says nothing here
    units = by_nearest_n(rows.assign(eval_units=rows["eval_time_s"].to_numpy(float) / unit),
                         "eval_units", per_worker_share=True)
    return lambda n, b: units(n) * np.asarray(per_sample(n, b), dtype=float)


def measured_at_several_batches(profiles: pd.DataFrame) -> bool:
    """Whether some N's evaluation pass was measured at more than one local batch."""
    rows = profiles.dropna(subset=["eval_time_s"]) if "eval_time_s" in profiles else profiles[:0]
    return bool(len(rows)) and rows.groupby("num_workers")["local_batch"].nunique().max() > 1


def evaluation_between(rows: pd.DataFrame) -> BatchCost:
    """An evaluation pass's seconds at (N, b) from passes measured at several local
    batches (a sweep's smallest and largest): per N, log seconds linear in log2 b between
    its measured batches, held beyond them; at an N not measured, the nearest measured
    N's curve at the same b, its pass split over N workers (as `by_nearest_n`)."""
    curves = {int(n): group.groupby("local_batch")["eval_time_s"].median().clip(lower=1e-9)
              for n, group in rows.groupby("num_workers")}
    counts = np.array(sorted(curves), dtype=float)

    def at(num_workers: np.ndarray, local_batch: np.ndarray) -> np.ndarray:
        n, b = np.broadcast_arrays(np.asarray(num_workers, float), np.asarray(local_batch, float))
        nearest = counts[nearest_measured(n, counts)]
        seconds = np.empty(n.shape)
        for measured in np.unique(nearest):
            curve, where = curves[int(measured)], nearest == measured
            seconds[where] = np.exp(np.interp(np.log2(b[where]), np.log2(curve.index.to_numpy(
                float)), np.log(curve.to_numpy(float)))) * measured / n[where]
        return seconds
    return at


def compute_per_sample(params: perf.PerfParams) -> BatchCost:
    """Eq. 2b's compute seconds per sample at (N, b): the cost `evaluation_by_batch`
    prices an evaluation pass in."""
    return lambda n, b: perf.predict_compute_s(params, n, b) / np.asarray(b, dtype=float)


def step_extras(frame: pd.DataFrame, extra: StepExtra | None,
                plain_steps: Collection[tuple[int, int]] = ()) -> np.ndarray:
    """The training strategy's cost per step at each row of `frame`: `extra(N)`, and none
    where the strategy trains plain SGD steps (AGS at a B no larger than its reference
    batch): at the (N, B) in `plain_steps` and, between them, at a B no larger than a
    plain one of the same N (the dense curve's points)."""
    n = frame["num_workers"].to_numpy(float)
    if extra is None:
        return np.zeros(len(frame))
    largest_plain: dict[int, int] = {}
    for workers, batch in plain_steps:
        largest_plain[int(workers)] = max(int(batch), largest_plain.get(int(workers), 0))
    plain = np.array([b <= largest_plain.get(int(w), 0) for w, b
                      in zip(frame["num_workers"], frame["global_batch"])], dtype=bool)
    return np.where(plain, 0.0, extra(n))


def strategy_extra_by_n(profiles: pd.DataFrame) -> StepExtra | None:
    """What the training strategy adds to each step (issue 14, item 7), as a function of
    N: the strategy's steps less plain ones, measured in the same worker group
    (`by_nearest_n`). None when no worker group measured the strategy."""
    return by_nearest_n(profiles, "strategy_extra_s")


def startup_by_n(profiles: pd.DataFrame, check_s: float = 0.0) -> StepExtra | None:
    """The job's start-up as a function of N: `check_s` (the workload's check on a worker,
    which `train` runs before its launch) + the profiling launch's whole time beyond its
    candidates (`launch_fixed_s`), per N (`by_nearest_n`). Where the search did not record
    that (before 2026-11-27), the launch's start and data load only, which left out its
    set-up and end (`train-time --quick`: 9.3 s predicted, 13.9 s waited). None when no
    launch was timed."""
    if "launch_wall_s" not in profiles:
        return None
    load = profiles["data_load_s"].fillna(0.0) if "data_load_s" in profiles else 0.0
    started = profiles["launch_wall_s"] + load
    fixed = profiles["launch_fixed_s"].fillna(started) if "launch_fixed_s" in profiles \
        else started
    launch = by_nearest_n(profiles.assign(startup_s=fixed), "startup_s")
    if launch is None:
        return None
    return lambda num_workers: launch(num_workers) + check_s


@dataclass(frozen=True)
class EpochCosts:
    """What an epoch of `train` costs beyond its steps, and what the job costs once, as
    measured while profiling (issue 24): evaluation per epoch (N -> seconds, the pass
    split over N workers), rank 0's checkpoint write per epoch, and the start-up (N ->
    seconds, `startup_by_n`). Zero where not measured. `target`: how a run to a target
    evaluates instead, which the time to accuracy prices (`planning.target_costs`)."""

    eval_s: BatchCost | None = None  # (N, b) -> seconds (`evaluation_by_batch`)
    checkpoint_s: float = 0.0
    startup_s: StepExtra | None = None
    check_s: float = 0.0  # of the start-up: `train`'s check of the workload on a worker
    eval_scaled: bool = False  # the pass priced at each b (`evaluation_by_batch`)
    eval_between: bool = False  # ... between passes measured at several b
    target: TargetEvaluations | None = None

    @classmethod
    def from_profiles(cls, profiles: pd.DataFrame, check_s: float | None = None,
                      params: perf.PerfParams | None = None,
                      dataset_size: int | None = None) -> "EpochCosts":
        """check_s: the seconds a check of the workload on one worker took the search
        (`train` runs it before its launch), added to every N's start-up; None: unknown.
        params: where `train` evaluates at the local batch, the fit whose compute cost per
        sample prices the evaluation pass at each b (`evaluation_by_batch`).
        dataset_size: D, to price a run to a target's evaluations (`target`)."""
        per_sample = None if params is None else compute_per_sample(params)
        check_s = float(check_s) if check_s is not None and math.isfinite(check_s) else 0.0
        startup = startup_by_n(profiles, check_s)
        checkpoint = profiles["checkpoint_time_s"].dropna() if "checkpoint_time_s" in \
            profiles else pd.Series(dtype=float)
        eval_s = evaluation_by_batch(profiles, per_sample)
        return cls(eval_s=eval_s,
                   checkpoint_s=float(checkpoint.median()) if len(checkpoint) else 0.0,
                   startup_s=startup, check_s=check_s if startup is not None else 0.0,
                   eval_scaled=eval_s is not None and per_sample is not None,
                   eval_between=per_sample is not None and measured_at_several_batches(profiles),
                   target=None if eval_s is None or dataset_size is None
                   else TargetEvaluations.from_profiles(profiles, dataset_size))

    @classmethod
    def of_plan(cls, profiles: pd.DataFrame, meta: dict,
                params: perf.PerfParams) -> "EpochCosts":
        """A plan's costs, as its build makes them: from its meta's check of the workload
        and its context (`plan_context`: where `train` evaluates, D)."""
        context = meta.get("plan_context") or {}
        return cls.from_profiles(profiles, check_s=meta.get("workload_check_s"),
                                 params=params if context.get("eval_at_local_batch") else None,
                                 dataset_size=context.get("dataset_size"))

    def describe(self) -> str:
        """Which parts of the training time were measured, which left out."""
        evaluation = "an evaluation pass per epoch" + (
            " (at each candidate's local batch, " + (
                "between the passes measured at its N's smallest and largest b)"
                if self.eval_between else "from the compute cost per sample)")
            if self.eval_scaled else "")
        parts = {evaluation: self.eval_s is not None,
                 "a checkpoint write per epoch": self.checkpoint_s > 0,
                 "the start-up (" + ("the workload's check on a worker, " if self.check_s
                                     else "") + "the worker group's launch, data load, "
                 "set-up and end)": self.startup_s is not None}
        measured = [name for name, known in parts.items() if known]
        missing = [name for name, known in parts.items() if not known]
        text = ("training times: each epoch's steps, data path included (measured where "
                "profiled, predicted elsewhere)")
        if measured:
            text += "; measured once and added: " + ", ".join(measured)
        if missing:
            text += "; not measured, left out: " + ", ".join(missing)
        if self.target is not None:
            text += "; the time to accuracy prices " + self.target.describe()
        return text


def add_epoch_times(frame: pd.DataFrame, step_column: str, epochs: int, dataset_size: int,
                    costs: EpochCosts, *, prefix: str = "", whole_steps: bool = True) -> None:
    """Eq. 4a with what `train` waits for: `{prefix}epoch_time_s` (the steps of one epoch,
    data path and strategy included: what `train`'s `seconds` measures) and
    `{prefix}total_time_s` = epochs x (epoch + evaluation + checkpoint) + start-up; the
    per-epoch costs (`eval_time_s`, `checkpoint_time_s`, `startup_time_s`, and a run to a
    target's `target_extra_s`) are added as columns when not there yet."""
    n = frame["num_workers"].to_numpy(float)
    zero = np.zeros(len(frame))
    if "eval_time_s" not in frame:
        frame["eval_time_s"] = zero if costs.eval_s is None else costs.eval_s(
            n, frame["local_batch"].to_numpy(float))
        frame["checkpoint_time_s"] = zero + costs.checkpoint_s
        frame["startup_time_s"] = zero if costs.startup_s is None else costs.startup_s(n)
    if "target_extra_s" not in frame:
        add_target_extras(frame, costs.target)
    frame[f"{prefix}epoch_time_s"] = perf.training_time_s(  # eq. 4a for one epoch
        frame[step_column] + frame["strategy_extra_s"], 1, dataset_size, frame["global_batch"],
        whole_steps)
    frame[f"{prefix}total_time_s"] = (
        epochs * (frame[f"{prefix}epoch_time_s"] + frame["eval_time_s"]
                  + frame["checkpoint_time_s"]) + frame["startup_time_s"])


def predict_candidates(space_frame: pd.DataFrame, params: perf.PerfParams,
             memory: memory_model.MemoryParams | None, billing: NodeBilling,
             epochs: int, dataset_size: int, whole_steps: bool = True,
             strategy_extra: StepExtra | None = None,
             costs: EpochCosts = EpochCosts(),
             plain_steps: Collection[tuple[int, int]] = ()) -> pd.DataFrame:
    """Eq. 2 (step), 4a (training time: the epoch's steps with the training strategy's
    measured cost per step, `strategy_extra`, none where it trains plain steps
    (`step_extras`), and the epoch's other measured `costs`), 3 (memory) and 4b (cost, in
    the whole nodes of `billing`) per row."""
    frame = space_frame.copy()
    n, b = frame["num_workers"].to_numpy(float), frame["local_batch"].to_numpy(float)
    frame["num_nodes"] = perf.packed_nodes(n, params.workers_per_node).astype(int)
    frame["compute_time_s"] = perf.predict_compute_s(params, n, b)
    frame["step_time_s"] = perf.predict_step_s(params, n, b)
    frame["sync_time_s"] = frame["step_time_s"] - frame["compute_time_s"]
    frame["strategy_extra_s"] = step_extras(frame, strategy_extra, plain_steps)
    add_epoch_times(frame, "step_time_s", epochs, dataset_size, costs, whole_steps=whole_steps)
    frame["peak_mem_bytes"] = (np.nan if memory is None
                               else memory_model.predict_peak_bytes(memory, b))
    frame["cost_usd"] = billing.cost_usd(
        frame["total_time_s"].to_numpy(float), n, frame["peak_mem_bytes"].to_numpy(float))
    return frame


def add_estimates(table: pd.DataFrame, billing: NodeBilling) -> pd.DataFrame:
    """What the policy chooses on: a profiled candidate's own measured training time (and
    the cost from it, with its measured peak memory) in place of the model's prediction;
    the prediction where nothing was measured. A search measures a candidate to check the
    model there, so its choice rests on what it measured (adaptive search measures its
    choice for this reason). Adds `estimated_total_time_s`, `estimated_peak_mem_bytes`,
    `estimated_cost_usd` and `estimate` ("measured"/"predicted") to `table`; returns the
    table with the estimates in the policy's columns (total_time_s, cost_usd)."""
    measured = ((table["status"] == STATUS_OK) & table["measured_total_time_s"].notna()).to_numpy()
    time_s = np.where(measured, table["measured_total_time_s"], table["total_time_s"])
    peak = table["measured_peak_mem_bytes"].where(table["measured_peak_mem_bytes"] > 0)
    peak = np.where(measured & peak.notna().to_numpy(), peak, table["peak_mem_bytes"])
    table["estimated_total_time_s"] = time_s
    table["estimated_peak_mem_bytes"] = peak.astype(float)
    table["estimated_cost_usd"] = billing.cost_usd(
        time_s.astype(float), table["num_workers"].to_numpy(float), peak.astype(float))
    table["estimate"] = np.where(measured, "measured", "predicted")
    return table.assign(total_time_s=table["estimated_total_time_s"],
                        cost_usd=table["estimated_cost_usd"])


def add_uncertainty(table: pd.DataFrame, profiles: pd.DataFrame,
                     params: perf.PerfParams) -> float:
    """How sure the plan is of each row (issue 11, item 4), as a relative half-width:
    a measured row, its own measured spread (interquartile range / median of its
    steps); a predicted row, the fit's out-of-sample error (leave-one-out median) plus
    the median measured spread. Adds `rel_uncertainty` and the training-time interval
    `total_time_low_s` / `total_time_high_s`; returns the predicted rows' value."""
    spreads = usable(profiles)["step_time_spread"] if "step_time_spread" in profiles else \
        pd.Series(dtype=float)
    spreads = spreads.dropna()
    typical = float(spreads.median()) if len(spreads) else 0.0
    out_of_sample = params.loo_median_rel_error
    predicted = (out_of_sample if out_of_sample is not None else 0.0) + typical
    spread = table.merge(profiles[["num_workers", "global_batch", "step_time_spread"]],
                         on=["num_workers", "global_batch"], how="left")["step_time_spread"]
    measured = (table["source"] == "measured").to_numpy()
    u = np.where(measured, spread.fillna(typical).to_numpy(float), predicted)
    table["rel_uncertainty"] = u
    table["total_time_low_s"] = table["total_time_s"] * (1.0 - u)
    table["total_time_high_s"] = table["total_time_s"] * (1.0 + u)
    return predicted


def dense_curve(space, params, memory, billing, epochs, dataset_size, oom_local,
                 max_local_batch, max_workers, max_global_batch,
                 strategy_extra: StepExtra | None = None,
                 costs: EpochCosts = EpochCosts(),
                 plain_steps: Collection[tuple[int, int]] = ()) -> pd.DataFrame:
    """Predictions on a dense log-spaced batch grid for every N: what the knee is found on."""
    batches = np.geomspace(space.batch_sizes[0], space.batch_sizes[-1], DENSE_POINTS)
    grid = pd.DataFrame([(n, b) for n in space.cluster_sizes for b in batches],
                        columns=["num_workers", "global_batch"])
    grid["local_batch"] = grid["global_batch"] / grid["num_workers"]
    # Unrounded steps per epoch: the knee is a property of the smooth curve (eq. 4a);
    # snapping to a candidate afterwards uses the candidate table's rounded times.
    dense = predict_candidates(grid, params, memory, billing, epochs, dataset_size,
                               whole_steps=False, strategy_extra=strategy_extra, costs=costs,
                               plain_steps=plain_steps)
    feasible = (dense["local_batch"] < oom_local) & (dense["local_batch"] >= 1)
    if max_local_batch is not None:
        feasible &= dense["local_batch"] <= max_local_batch
    if max_workers is not None:
        feasible &= dense["num_workers"] <= max_workers
    if max_global_batch is not None:
        feasible &= dense["global_batch"] <= max_global_batch
    dense["feasible"] = feasible
    return dense


def through_measurements(dense: pd.DataFrame, table: pd.DataFrame,
                          billing: NodeBilling) -> pd.DataFrame:
    """The dense curve bent through what was measured, as the candidates' estimates are:
    per N, the ratio measured / predicted training time at each measured batch,
    interpolated linearly in log2 B (held constant beyond the first and last measured
    batch), multiplies the prediction. Where nothing was measured at an N the curve is
    the model's. So the knee, like a minimum, rests on the measurements where there are
    some, and on the model's shape between them."""
    dense = dense.copy()
    measured = table[table["estimate"] == "measured"]
    for n, rows in measured.groupby("num_workers"):
        rows = rows.sort_values("global_batch")
        ratio = np.log(rows["measured_total_time_s"].to_numpy(float)
                       / rows["total_time_s"].to_numpy(float))
        at_n = dense["num_workers"] == n
        x = np.log2(dense.loc[at_n, "global_batch"].to_numpy(float))
        factor = np.exp(np.interp(x, np.log2(rows["global_batch"].to_numpy(float)), ratio))
        dense.loc[at_n, "total_time_s"] = dense.loc[at_n, "total_time_s"] * factor
    dense["cost_usd"] = billing.cost_usd(dense["total_time_s"].to_numpy(float),
                                         dense["num_workers"].to_numpy(float),
                                         dense["peak_mem_bytes"].to_numpy(float))
    return dense
