"""`tula_ray.train()`: train a Plan's chosen (N, B) as a Ray Train job (DESIGN step 7).

    plan = tula_ray.search("fashion-mnist-cnn")
    result = tula_ray.train(plan, strategy="ags")   # or train("plan/plan.json")
    result.metrics  # one row per epoch: train loss/accuracy, test accuracy, AGS telemetry

The training entry point (Ray-facing); it never imports the search entry point.
One `TorchTrainer` with N workers runs `trainables.training_loop.train_loop_per_worker`:
the metrics are reported every epoch (Ray dashboard, Train page), a checkpoint is
kept every epoch, and after a worker failure the run resumes from the last
checkpoint, up to `max_failures` times. Every argument is checked before Ray
starts; a cluster too small for N is refused before any worker is launched.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig
from ray.train.torch import TorchConfig, TorchTrainer

from trainables.training_loop import METRICS_FILE, load_checkpoint_state, train_loop_per_worker
from tula_ray.arguments import (check_bool, check_choice, check_int, check_mapping, check_number,
                                check_text)
from tula_ray.cluster import (PROVISION_TIMEOUT_S_DEFAULT, Workers, check_runtime_env,
                              check_worker_request, cluster_for_run, prompt_train_polls,
                              scaling_config)
from tula_ray.planning.plan import Plan
from tula_ray.planning.run_check import Planned, against_plan, planned_for_run
from tula_ray.runs.adaptive_batch import BATCH_MODES, adaptive_batch_of, batch_mode
from tula_ray.runs.training_job import Job, checked_on_worker, dry_run, resolve_job
from tula_ray.training.batch_controller import AdaptiveBatch
from tula_ray.training.budget import BUDGETS
from tula_ray.training.strategies import TRAINING_STRATEGY_DEFAULT, TrainingStrategy
from tula_ray.training.target import TARGET_SUMMARY, check_target
from tula_ray.verbosity import VERBOSE_DEFAULT, check_verbose, ray_log_level
from tula_ray.workloads import Workload

logger = logging.getLogger(__name__)

MAX_FAILURES_DEFAULT = 2  # worker-group restarts from the last checkpoint before giving up
UNLIMITED_FAILURES = -1  # Ray's FailureConfig value for "retry forever"
# A collective still waiting after this has lost a peer (a crash, a hang): the job fails
# (and restarts from its checkpoint) in minutes, not after torch's 30, with every GPU idle.
# An epoch's slowest gap between two collectives (a rank loading its data, rank 0 writing a
# checkpoint) must fit in it: raise it for a data set that takes longer to load.
COLLECTIVE_TIMEOUT_S_DEFAULT = 600
# Checkpoints kept in storage: the last two (one more in case the last is cut short). Every
# epoch's would stay in cloud storage, billed; the metrics of every epoch travel with each.
KEEP_CHECKPOINTS_DEFAULT = 2


@dataclass
class TrainResult:
    """What `train` returns.

    metrics: one row per epoch (epoch, resumed_from, optimizer (what trained: the
      workload's own, e.g. "TulaOptimizer(Adam)" under AGS-NS), train_loss, train_accuracy,
      test_loss, test_accuracy, lr, seconds, steps; for AGS scaled_fraction,
      variability_median, scale_mean/min/max; for fp16 loss_scale), in epoch order. A run
      to a target adds val_loss, val_accuracy (the epoch's last evaluation), val_seconds
      and the `target` figures; its test_* are on the last row only (read once, at the end).
    checkpoint_path: the last epoch's checkpoint directory (None if none was kept).
    target: a run to a target's outcome (`tula_ray.training.target.TargetTracker.summary`:
      target_accuracy, target_reached, time_to_target_s, samples_to_target,
      steps_to_target, evaluations), else None.
    result: Ray Train's `Result` (its `path` is the run directory).
    """

    metrics: pd.DataFrame
    checkpoint_path: str | None
    result: Any  # ray.train.Result (Ray Train V2, Ray 2.60: a failed run raises in fit)
    num_workers: int
    global_batch: int
    strategy: str
    notes: list[str]  # where the run departs from what was asked, and why
    target: dict[str, Any] | None = None
    planned: Planned | None = None  # the plan's figures for this run (a fixed batch's)

    def against_plan(self) -> pd.DataFrame:
        """The plan's training and evaluation seconds per epoch beside this run's
        (`tula_ray.planning.run_check.against_plan`); empty for an adaptive batch."""
        if self.planned is None:
            return pd.DataFrame(columns=["what", "planned", "measured", "ratio"])
        return against_plan(self.planned, self.metrics)

    @property
    def evaluations(self) -> pd.DataFrame:
        """A run to a target: one row per evaluation of the validation split (epoch, steps,
        samples, seconds, val_loss, val_accuracy), from the last checkpoint."""
        state = self.load_checkpoint().get("target") or {}
        return pd.DataFrame(state.get("evaluations", []))

    @property
    def batch_schedule(self) -> pd.DataFrame:
        """An adaptive batch's decisions (step, samples, global_batch, accumulation,
        noise_scale, goodput, switched, reason), from the last checkpoint; empty for a
        fixed batch."""
        state = self.load_checkpoint().get("adaptive") or {}
        return pd.DataFrame(state.get("schedule", []))

    def load_checkpoint(self) -> dict[str, Any]:
        """The last checkpoint's state: model, optimizer (incl. AGS), scheduler, epoch, ..."""
        checkpoint = self.result.checkpoint
        if checkpoint is None:
            raise FileNotFoundError("the run kept no checkpoint")
        with checkpoint.as_directory() as directory:  # fetched first when storage is remote
            return load_checkpoint_state(directory)


def train(
    plan: Plan | str | Path,
    strategy: str | TrainingStrategy = TRAINING_STRATEGY_DEFAULT,
    *,
    workload: str | Workload | None = None,
    workload_options: dict[str, Any] | None = None,
    epochs: int | None = None,
    strategy_options: dict[str, Any] | None = None,
    storage_path: str | None = None,
    name: str | None = None,
    max_failures: int = MAX_FAILURES_DEFAULT,
    seed: int = 0,
    use_gpu: bool | None = None,
    lr: float | None = None,
    fail_at_epoch: int | None = None,
    address: str | None = None,
    resources_per_worker: dict[str, float] | None = None,
    provision_timeout_s: float = PROVISION_TIMEOUT_S_DEFAULT,
    runtime_env: dict[str, Any] | None = None,
    precision: str | None = None,
    budget: str = "epochs",
    verbose: int = VERBOSE_DEFAULT,
    target_accuracy: float | None = None,
    eval_every_samples: int | None = None,
    validation_fraction: float | None = None,
    keep_checkpoints: int | None = KEEP_CHECKPOINTS_DEFAULT,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S_DEFAULT,
    batch: str | None = None,
) -> TrainResult:
    """Train the plan's chosen N and B as a Ray Train job and return the per-epoch metrics.

    plan: a Plan, or the path (or JSON text) of one written by `Plan.to_json`.
    strategy: "ags" (the paper's method) or a baseline, a name registered in
      tula_ray.training.strategies.TRAINING_STRATEGIES, or a TrainingStrategy object (a strategy
      of your own reaches the workers that way); strategy_options: its options, checked
      by the strategy against N and B before any worker starts.
    workload, workload_options: default the plan's (its `workload` name, and
      `meta["workload_options"]` when recorded); required when the plan names no
      built-in workload (e.g. a replayed or synthetic plan).
    epochs: default workload_options["epochs"] when given, else the plan's `epochs_to_train`:
      under an objective to an accuracy the choice's `epochs_to_target` (rounded up), the
      epochs its predicted time to accuracy counts; otherwise the plan's `epochs`.
    storage_path, name: where Ray Train keeps checkpoints and results (default ~/ray_results).
    max_failures: restarts after a worker failure, each from the last checkpoint (-1: no limit).
    seed: initial weights and data order. lr: the base LR before strategy scaling
      (default the workload's, paper §IV-B). use_gpu: default whether the cluster has GPUs.
    fail_at_epoch: tests only: rank 0 raises once at the start of that epoch.
    address: the Ray cluster to join ("auto": the one this machine belongs to); default
      $RAY_ADDRESS, else a new local Ray on loopback (see tula_ray.cluster.ensure_ray).
    resources_per_worker: one worker's resources as in Ray's ScalingConfig, e.g. {"CPU": 4};
      default one device per worker (a GPU, or a CPU). provision_timeout_s: how long to
      wait for an autoscaler's nodes. On a multi-node cluster storage_path must be
      reachable from every node (a shared file system or a cloud URI).
    runtime_env: the Ray runtime environment every worker inherits (your own modules,
      environment variables, pip packages), as `tula_ray.search`'s.
    precision: "fp32", "tf32", "bf16" or "fp16" (`tula_ray.precision`); default the plan's (what
      its steps were profiled in), else the workload's.
    budget: "epochs" (train `epochs`), or "scale-invariant" (`tula_ray.training.budget`):
      train until AdaScale's progress, reported every epoch as `progress`, reaches `epochs`
      at the strategy's reference batch (AGS-NS's small_batch, 32): between `epochs` and
      `epochs` x B / 32 epochs. A strategy without a gain trains its epochs (a note says so).
      A resumed run keeps its progress (the checkpoint holds it).
    verbose: what the run prints (`tula_ray.verbosity`): 1 (the default) a line naming the
      Ray dashboard and one per epoch (rank 0's loss, accuracy and seconds); 0 nothing but
      errors and warnings; 2 Ray's start and Ray Train's INFO logs too (the workers'
      set-up, each report's dict).
    target_accuracy: train until the accuracy on a validation split reaches it, then stop
      (`tula_ray.training.target`): the split is evaluated every `eval_every_samples`
      training samples (rounded to whole steps; default about a quarter epoch), the
      epochs (or the progress budget) the most it trains; not reaching it is not an
      error (`TrainResult.target` says so). The test set is read once, at the end.
    validation_fraction: the share of the training set held out as that split (default
      0.1, drawn with a fixed seed, never the test set); a workload with its own
      `val_dataset_fn` is judged on that instead.
    keep_checkpoints: the last k epochs' checkpoints kept in storage (default 2; None:
      every epoch's); `metrics` has every epoch whatever k is.
    collective_timeout_s: how long a collective (an all-reduce) may wait for a peer before
      the job fails and restarts from its checkpoint (default 600 s; torch's own is 1800).
    batch: "fixed" (the plan's B throughout) or "adaptive"; default the plan's own choice
      ("adaptive" when it chose its "adaptive at N" row, `Plan.adaptive`). Adaptive:
      inside the plan's N, B is chosen again every `eval_every_samples` (default about a
      quarter epoch) among the plan's candidates at N (those over the memory bound in
      micro-batches), the one with the most goodput = samples/s(B) (the plan's step-time
      model) x E(B) (the noise scale measured while training), switched to for a
      predicted gain of 5 % or more (`tula_ray.training.batch_controller`). The
      LR follows: AdaScale's gain (ags, ags-ns), the linear rule (lrs, lars), unchanged
      (lbt); polo cannot change its B. The training set must be in-memory tensors.
      Each epoch's row has the B it ended at; `TrainResult.batch_schedule` every decision.
    Raises ValueError for a bad argument, before any worker starts; the workload is
    checked on one worker first (`tula_ray.search` says how), so its own code failing
    raises a `tula_ray.failures.UserCodeError` before the training job starts.
    """
    _check_arguments(locals())
    check_choice("budget", budget, BUDGETS)
    if batch is not None:
        check_choice("batch", batch, BATCH_MODES)
    check_verbose(verbose)
    resources = check_worker_request(resources_per_worker, provision_timeout_s, use_gpu)
    check_runtime_env(runtime_env)
    plan = plan if isinstance(plan, Plan) else Plan.from_json(plan)
    job = resolve_job(plan, strategy, workload, workload_options, epochs, strategy_options,
                      precision, budget)
    _check_fail_at_epoch(job, fail_at_epoch)
    _check_validation(job, validation_fraction)
    dry_run(job, plan.dataset_size)
    adaptive = _adaptive_batch(plan, job, batch_mode(plan, batch), eval_every_samples,
                               target_accuracy)
    marker_dir = tempfile.mkdtemp(prefix="tula-fail-") if fail_at_epoch is not None else None
    try:
        with cluster_for_run(job.num_workers, resources, address=address,
                             runtime_env=runtime_env, use_gpu=use_gpu, storage_path=storage_path,
                             timeout_s=provision_timeout_s, verbose=verbose) as workers:
            job = checked_on_worker(job, workers)
            config = _loop_config(job, seed=seed, lr=lr, budget=budget, verbose=verbose,
                                  fail_at_epoch=fail_at_epoch, marker_dir=marker_dir,
                                  target={"target_accuracy": target_accuracy,
                                          "eval_every_samples": eval_every_samples,
                                          "validation_fraction": validation_fraction,
                                          "adaptive": adaptive})
            run_config = _run_config(job, storage_path=storage_path, name=name,
                                     max_failures=max_failures, verbose=verbose,
                                     keep_checkpoints=keep_checkpoints)
            trainer = _trainer(job, config, workers, run_config, collective_timeout_s)
            result = trainer.fit()
    finally:
        if marker_dir is not None:
            shutil.rmtree(marker_dir, ignore_errors=True)
    return _train_result(result, job, None if adaptive is not None else planned_for_run(
        plan, job.num_workers, job.global_batch, target_accuracy is not None))


def _train_result(result: Any, job: Job, planned: Planned | None) -> TrainResult:
    """What `train` returns, from Ray Train's result and the job it ran."""
    metrics = _metrics(result)
    return TrainResult(metrics, None if result.checkpoint is None
                       else result.checkpoint.path, result, job.num_workers,
                       job.global_batch, job.strategy_name, list(job.notes),
                       _target_outcome(metrics), planned)


def _check_arguments(a: Mapping[str, Any]) -> None:
    """The plain arguments' types and ranges (`train`'s, by name), before anything is built
    (issue 13, item 4)."""
    check_mapping("workload_options", a["workload_options"])
    check_mapping("strategy_options", a["strategy_options"])
    check_int("epochs", a["epochs"], minimum=1, optional=True)
    for label in ("storage_path", "name", "address"):
        check_text(label, a[label], optional=True)
    check_int("max_failures", a["max_failures"], minimum=UNLIMITED_FAILURES)  # -1: no limit
    check_int("seed", a["seed"])
    check_bool("use_gpu", a["use_gpu"], optional=True)
    check_number("lr", a["lr"], low=0.0, low_open=True, optional=True)
    check_int("keep_checkpoints", a["keep_checkpoints"], minimum=1, optional=True,
              hint="the last k checkpoints kept; None keeps every epoch's")
    check_number("collective_timeout_s", a["collective_timeout_s"], low=0.0, low_open=True,
                 hint="seconds a collective waits for a peer")
    check_target(a["target_accuracy"], a["eval_every_samples"], a["batch"] != "fixed")
    check_number("validation_fraction", a["validation_fraction"], low=0.0, high=1.0,
                 low_open=True, high_open=True, optional=True)
    if a["validation_fraction"] is not None and a["target_accuracy"] is None:
        raise ValueError(f"validation_fraction={a['validation_fraction']} is only used with a "
                         "target_accuracy: give one, or leave validation_fraction out")


def _adaptive_batch(plan: Plan, job: Job, batch: str, eval_every_samples: int | None,
                    target_accuracy: float | None) -> AdaptiveBatch | None:
    """The adaptive batch of a run with batch="adaptive" (`adaptive_batch_of`), else None:
    then an interval without a target is refused (it would choose nothing)."""
    if batch == "adaptive":
        return adaptive_batch_of(plan, job.num_workers, job.global_batch)
    check_target(target_accuracy, eval_every_samples)
    return None


def _check_validation(job: Job, validation_fraction: float | None) -> None:
    """A workload with its own validation split takes no share of the training set."""
    if validation_fraction is not None and job.workload.val_dataset_fn is not None:
        raise ValueError(f"validation_fraction={validation_fraction}, but workload "
                         f"{job.workload.name!r} has its own val_dataset_fn: give one of them")


def _check_fail_at_epoch(job: Job, fail_at_epoch: int | None) -> None:
    if fail_at_epoch is not None and not 0 <= fail_at_epoch < job.epochs:
        raise ValueError(f"fail_at_epoch={fail_at_epoch!r}; it must be within [0, "
                         f"{job.epochs}) for a run of {job.epochs} epochs")


def _loop_config(job: Job, *, seed: int, lr: float | None, budget: str, verbose: int,
                 fail_at_epoch: int | None, marker_dir: str | None,
                 target: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What each worker's loop (`trainables.training_loop`) is given: the job, its seed, LR,
    budget, verbosity and target (target_accuracy, eval_every_samples,
    validation_fraction), and (tests only) the epoch where rank 0 fails once."""
    config: dict[str, Any] = {
        "workload": job.spec, "workload_options": job.options, "global_batch": job.global_batch,
        "epochs": job.epochs, "strategy": job.strategy, "strategy_options": job.strategy_options,
        "seed": seed, "lr": lr, "budget": budget, "verbose": verbose, **(target or {})}
    if fail_at_epoch is not None:
        config.update(fail_at_epoch=fail_at_epoch, fail_marker_dir=marker_dir)
    return config


def _trainer(job: Job, config: dict[str, Any], workers: Workers, run_config: RunConfig,
             collective_timeout_s: float = COLLECTIVE_TIMEOUT_S_DEFAULT) -> TorchTrainer:
    """The TorchTrainer of `job` running the training loop on `config`, placed as the
    search profiled N, its collectives timed out after `collective_timeout_s`; its
    controller polls the workers promptly (`prompt_train_polls`)."""
    prompt_train_polls()
    logger.info("training %s with %s at N=%d, B=%d for %d epochs (run %s)", job.workload.name,
                job.strategy_name, job.num_workers, job.global_batch, job.epochs,
                run_config.name)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=config,
        torch_config=TorchConfig(timeout_s=int(math.ceil(collective_timeout_s))),
        # Placed as the search profiled N (N <= G workers per node on one node, issue 26):
        # the plan's step time is this placement's.
        scaling_config=scaling_config(job.num_workers, workers.resources,
                                      workers.workers_per_node),
        run_config=run_config,
    )


def _run_config(job: Job, *, storage_path: str | None, name: str | None, max_failures: int,
                verbose: int = VERBOSE_DEFAULT,
                keep_checkpoints: int | None = KEEP_CHECKPOINTS_DEFAULT) -> RunConfig:
    """Where `job`'s run is kept (its name defaulting to what it trains, and when), how
    often it restarts, how many checkpoints stay, and what Ray Train logs."""
    name = name or (f"tula-train-{job.workload.name}-{job.strategy_name}-N{job.num_workers}"
                    f"-B{job.global_batch}-{datetime.now():%Y%m%d-%H%M%S}")
    return RunConfig(
        name=name, storage_path=storage_path,
        failure_config=FailureConfig(max_failures=max_failures),
        # Each checkpoint carries every epoch's metrics so far (METRICS_FILE).
        checkpoint_config=CheckpointConfig(num_to_keep=keep_checkpoints),
        logging_config=LoggingConfig(log_level=ray_log_level(verbose)))


def _target_outcome(metrics: pd.DataFrame) -> dict[str, Any] | None:
    """The last row's target figures (`TargetTracker.summary`), None for a run without."""
    if metrics.empty or "target_accuracy" not in metrics:
        return None
    last = metrics.iloc[-1]
    return {key: last[key].item() if hasattr(last[key], "item") else last[key]
            for key in TARGET_SUMMARY}


def _metrics(result: Any) -> pd.DataFrame:
    """One row per epoch: every epoch's rows travel with the last checkpoint
    (METRICS_FILE; older ones may be deleted, `keep_checkpoints`); a checkpoint written
    before that, the kept checkpoints' own rows (Train V2 keeps rank 0's with each)."""
    rows = _rows_with(result.checkpoint)
    if rows is None:
        rows = [metrics for _, metrics in (result.best_checkpoints or [])]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    # An epoch reported twice (a failure during its checkpoint upload): keep the later run.
    frame = frame.drop_duplicates(subset="epoch", keep="last").sort_values("epoch")
    return frame.reset_index(drop=True)


def _rows_with(checkpoint: Any) -> list[dict[str, Any]] | None:
    """The metrics rows a checkpoint carries, read alone from its storage (the model's
    state stays there); None for none."""
    if checkpoint is None:
        return None
    path = f"{checkpoint.path.rstrip('/')}/{METRICS_FILE}"
    try:
        with checkpoint.filesystem.open_input_stream(path) as stream:
            return json.loads(stream.read().decode())
    except FileNotFoundError:
        return None
