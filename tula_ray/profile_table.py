"""The profile table: one row per profiled (N, B) candidate.

This is the contract between the Ray side (trainables report these fields) and
the models (perf and memory fit from them). Times are per training step as an epoch of
`tula_ray.train` takes it (its data path included), means over the measured steps, in
seconds; the epoch's other costs (evaluation, checkpoint) are per epoch.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import pandas as pd

STATUS_OK = "ok"
STATUS_OOM = "oom"  # ran out of (declared) device memory: infeasible, not a crash
STATUS_ERROR = "error"  # crashed for another reason; reported, never fatal to a search
STATUSES = (STATUS_OK, STATUS_OOM, STATUS_ERROR)
# A failed row's class in the search's one taxonomy (tula_ray.failures says what each means)
FAILURE_OOM = "oom"
FAILURE_USER_CODE = "user_code"
FAILURE_INFRASTRUCTURE = "infrastructure"
FAILURES = (FAILURE_OOM, FAILURE_USER_CODE, FAILURE_INFRASTRUCTURE)

PROFILE_COLUMNS = (
    "num_workers",  # N
    "global_batch",  # B
    "local_batch",  # b = B / N
    # nodes the worker group spanned (its workers' distinct node IDs): N <= G workers per
    # node share one node, a larger N crosses the network (`tula_ray.models.topology`).
    # NaN where not measured: a row of a group that never started, or a table recorded
    # before issue 26 (a model then takes `topology.nodes_for(N, G)`)
    "num_nodes",
    "compute_time_s",  # forward + backward + optimizer step without gradient sync
    "sync_time_s",  # step_time_s - compute_time_s (0 for N = 1: no collective)
    "step_time_s",  # one synchronous data-parallel step
    # seconds the training strategy's optimizer and hooks (AGS's scales, a host sync, its
    # all-reduces) add to a step; measured once per worker group, on its first row
    "strategy_extra_s",
    # per epoch of `train`, measured once per worker group, on its first row: one
    # evaluation pass over the test set on N workers, and rank 0's checkpoint write
    "eval_time_s",
    "checkpoint_time_s",
    # the samples of that pass (the test set's), and of the workload's own validation
    # split where it has one (NaN: none, or a table recorded before 2026-11-29): the plan
    # prices a run to a target's validation passes by them (`planning.target_costs`)
    "eval_samples",
    "validation_samples",
    "data_load_s",  # the worker's dataset load and placement (once per worker group)
    # the gradient noise at this (N, B) (`tula_ray.models.noise_scale`): |G|^2, tr(Sigma)
    # of one sample, and the untimed steps whose squared norms they average
    "grad_sqr",
    "grad_var",
    "noise_steps",
    # how far the profiled model had trained when its noise was measured (its worker
    # group's optimizer steps, and their samples, over the sweep's batches so far): phi
    # grows as a model trains, and these steps depend on the device's speed (issue 43)
    "noise_after_steps",
    "noise_after_samples",
    "peak_mem_bytes",  # peak device memory of one worker
    # NCCL's communicator buffers on one GPU of this worker group, measured at its first
    # collective (no peak counter sees them); NaN where not measured (CPU, N = 1)
    "nccl_buffer_bytes",
    "samples_per_s",  # B / step_time_s
    "step_time_spread",  # (q3 - q1) / median of the synced steps: this row's own timing noise
    "measure_steps",  # steps timed in each phase (more where steps are short: same budget)
    "round",  # the search round that asked for this candidate (1, 2, ...)
    "launch_wall_s",  # start of the worker group that profiled it (same for its whole sweep)
    "profile_wall_s",  # wall time of this candidate inside its worker group
    # the worker group's whole launch (its trial's start to its end) less its candidates'
    # profile_wall_s: what a `train` job waits for beyond its epochs (same for the sweep)
    "launch_fixed_s",
    "warmup_wall_s",  # of which the untimed warm-up steps
    "timed_wall_s",  # of which the timed steps (compute and synced phases)
    "status",
    "failure",  # a failed row's class: one of FAILURES; "" for an ok row
    "error",  # "Type: message" of a failed row
)
ID_COLUMNS = PROFILE_COLUMNS[:3]
NUMERIC_COLUMNS = PROFILE_COLUMNS[:-3]
TEXT_COLUMNS = PROFILE_COLUMNS[-2:]
MAX_ERROR_CHARS = 2000  # keep a traceback-sized message out of every results table
# After its worker group ends, a profiling trial reports the launch's seconds under this
# key (with no candidate): the searcher turns them into its rows' `launch_fixed_s`.
LAUNCH_TOTAL_KEY = "launch_total_s"
# A failed row's report also carries the worker's traceback under this key: the searcher
# keeps it once per distinct error (tula_ray.failures.record_error), not in every row.
TRACEBACK_KEY = "traceback"


def profile_frame(rows: Iterable[Mapping] = ()) -> pd.DataFrame:
    """Rows (dicts) as a profile table with every column, in order; missing fields are NaN/''."""
    frame = pd.DataFrame(list(rows), columns=list(PROFILE_COLUMNS))
    for column in NUMERIC_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["status"] = frame["status"].fillna(STATUS_OK).astype(str)
    for column in TEXT_COLUMNS:
        frame[column] = frame[column].astype(object).where(frame[column].notna(), "").astype(str)
    unknown = sorted(set(frame["status"]) - set(STATUSES))
    if unknown:
        raise ValueError(f"profile status {unknown[0]!r} is not one of {STATUSES}")
    return frame


def profile_row(num_workers: int, global_batch: int, metrics: Mapping | None = None, *,
                status: str | None = None, error: str | None = None,
                failure: str | None = None) -> dict[str, Any]:
    """The one builder of a profile row: every PROFILE_COLUMNS field, NaN where nothing
    was measured (Tune rejects results that lack the search metric).

    (N, B) come from the arguments, never from `metrics` (what a trial reported).
    status: given, it wins; otherwise a row with an `error`, or whose metrics report no
    status, is an error row: reported, never fatal. failure: the failed row's class
    (tula_ray.failures); an error row without one is infrastructure's.
    """
    row: dict[str, Any] = {column: math.nan for column in PROFILE_COLUMNS}
    row.update(num_workers=int(num_workers), global_batch=int(global_batch),
               local_batch=int(global_batch) // int(num_workers) if num_workers else 0,
               status=STATUS_OK, failure="", error="")
    if error is None and metrics and "status" in metrics:
        row.update({k: metrics[k] for k in PROFILE_COLUMNS if k in metrics
                    and k not in ID_COLUMNS})
    elif status is None:
        row.update(status=STATUS_ERROR, error=error or "no result reported")
    if status is not None:
        row["status"] = status
    if error is not None:
        row["error"] = error
    if failure is not None:
        row["failure"] = failure
    elif row["status"] != STATUS_OK and not row["failure"]:
        row["failure"] = FAILURE_OOM if row["status"] == STATUS_OOM else FAILURE_INFRASTRUCTURE
    row["error"] = str(row["error"])[-MAX_ERROR_CHARS:]
    return row


def usable(profiles: pd.DataFrame) -> pd.DataFrame:
    """The rows a model can fit: status ok and a finite step time."""
    ok = profiles[(profiles["status"] == STATUS_OK) & profiles["step_time_s"].notna()]
    return ok.reset_index(drop=True)


def oom_local_batch(profiles: pd.DataFrame) -> float:
    """Smallest local batch that ran out of memory (inf if none). Memory per worker
    depends on b only, so an OOM at b makes every b' >= b infeasible for every N."""
    oom = profiles[profiles["status"] == STATUS_OOM]
    return float(oom["local_batch"].min()) if len(oom) else math.inf
