"""The Ray Train per-worker loop that trains the chosen (N, B) (DESIGN "Data flow" step 6).

Each worker trains its share of the global batch B (local batch B / N) with a
strategy of `tula_ray.training.strategies` (AGS by default) for the workload's epochs,
scores the whole test set every epoch, and reports the metrics with
`ray.train.report`, so they show in the Ray dashboard. Rank 0 attaches a
checkpoint every epoch (model, optimizer with the AGS state, scheduler, epoch:
`tula_ray.training.checkpoints.checkpoint_state`); after a worker failure Ray Train restarts
the group and the loop resumes from `ray.train.get_checkpoint()`.

The epoch logic is `tula_ray.training`'s, shared with single-process runs: the
data order is a function of (seed, epoch) only, so a resumed run sees the same
batches as one that never stopped.
"""

from __future__ import annotations

import json
import math
import logging
import tempfile
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch

from tula_ray.training.checkpoints import checkpoint_state, restore_state
from tula_ray.training.run import Run, prepare_run
from tula_ray.training.strategy_base import describe_optimizer
from tula_ray.verbosity import QUIET, ray_log_level, set_worker_log_level, show
from tula_ray.workloads import resolve_workload

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "state.pt"  # torch.save of `checkpoint_state` inside each checkpoint directory
# Beside it: every epoch's metrics row so far (JSON), so that `train` has them all when it
# keeps only the last checkpoints; read alone, without fetching the model's state.
METRICS_FILE = "metrics.json"
NOT_RESUMED = -1  # "resumed_from" of a run that started from scratch
SEED_DEFAULT = 0
FAIL_MARKER = "failed-once"  # file under config["fail_marker_dir"]: the injected failure happened


class InjectedFailure(RuntimeError):
    """Raised by `config["fail_at_epoch"]` to test recovery from a worker failure."""


def load_checkpoint_state(directory: str | Path, map_location: str | torch.device = "cpu"
                          ) -> dict[str, Any]:
    """The `checkpoint_state` dict saved in a checkpoint directory written by this loop."""
    # weights_only: a checkpoint holds tensors, numbers and strings only; refuse pickled code.
    return torch.load(Path(directory) / CHECKPOINT_FILE, map_location=map_location,
                      weights_only=True)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train loop: train `config["global_batch"]` on this worker group, one report per epoch.

    config: workload (name or Workload), workload_options, global_batch, epochs,
    strategy (a registered name or a TrainingStrategy object), strategy_options, seed, lr
    (optional: the base LR before any strategy scaling; default the workload's),
    validation_fraction (tuning: score a held-out share of the training set as
    val_loss/val_accuracy), target_accuracy + eval_every_samples (train until the
    validation split reaches it: `tula_ray.training.target`; the test set at the end),
    checkpoint (default True: rank 0 keeps one per epoch), budget ("epochs" or
    "scale-invariant": `tula_ray.training.budget`), verbose (`tula_ray.verbosity`, default 0: at 1 and above
    rank 0 prints a line per epoch), fail_at_epoch + fail_marker_dir
    (tests only: rank 0 raises once, at the start of that epoch).
    """
    if "verbose" in config:  # tula_ray.train's run; tuning's trials log as before
        set_worker_log_level(ray_log_level(config["verbose"]))
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    global_batch, seed = int(config["global_batch"]), int(config.get("seed", SEED_DEFAULT))
    run = _prepared(config, rank, world_size)
    # Tuning: the held-out split is scored as "val_*" (the test set is never loaded) and,
    # trials being throw-away, no checkpoint is written. A run to a target names its own.
    validating = bool(config.get("validation_fraction")) and run.tracker is None
    keep_checkpoints = bool(config.get("checkpoint", True))
    setup = run.setup
    start_epoch, resumed_from, history = _resume_point(run, rank)

    fixed = {"num_workers": world_size, "global_batch": global_batch,
             "local_batch": global_batch // world_size, "strategy": setup.name,
             "optimizer": describe_optimizer(setup.optimizer), "seed": seed,
             "resumed_from": resumed_from}
    for epoch, metrics in run.train_epochs(start_epoch,
                                           before=lambda e: _maybe_fail(config, e, rank)):
        if validating:
            metrics = {key.replace("test_", "val_"): value for key, value in metrics.items()}
        row = {"epoch": epoch, **fixed, **_scalars(metrics)}
        history.append(row)
        if rank == 0:
            # a scale-invariant budget trains until its progress is reached: no known count
            planned = config["epochs"] if config.get("budget", "epochs") == "epochs" else None
            show(epoch_line(row, planned), config.get("verbose", QUIET))
        _report(row, _checkpoint(run, epoch) if rank == 0 and keep_checkpoints else None,
                epoch, history)


def _checkpoint(run: Run, epoch: int) -> dict[str, Any]:
    """The run's state after `epoch` (`checkpoint_state`), a run to a target's tracker and
    the online noise scale's averages (read at the epoch's end) included."""
    return checkpoint_state(run.model, run.setup, epoch,
                            None if run.tracker is None else run.tracker.state_dict(),
                            None if run.noise is None else run.noise.state_dict(),
                            None if run.adapter is None else run.adapter.state_dict())


def _prepared(config: dict[str, Any], rank: int, world_size: int) -> Run:
    """This worker's run, as `fit` sets one up: prepare_model wraps in DDP; the batches come
    on the device by the data path the profile timed (Ray's prepare_data_loader would only
    move them)."""
    return prepare_run(
        resolve_workload(config["workload"], config.get("workload_options")),
        global_batch=int(config["global_batch"]), strategy=config["strategy"],
        epochs=int(config["epochs"]), seed=int(config.get("seed", SEED_DEFAULT)),
        device=ray.train.torch.get_device(), options=config.get("strategy_options"),
        lr=None if config.get("lr") is None else float(config["lr"]),
        num_replicas=world_size, rank=rank, wrap_model=ray.train.torch.prepare_model,
        validation_fraction=float(config.get("validation_fraction") or 0.0),
        budget=config.get("budget", "epochs"), target_accuracy=config.get("target_accuracy"),
        eval_every_samples=config.get("eval_every_samples"), adaptive=config.get("adaptive"))


def _resume_point(run: Run, rank: int) -> tuple[int, int, list[dict[str, Any]]]:
    """(the first epoch to train, the epoch resumed after, the metrics rows so far): from
    the checkpoint Ray Train restarted the run with, its state restored into the run's
    model and setup (and a run to a target's tracker); else (0, NOT_RESUMED, [])."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0, NOT_RESUMED, []
    with checkpoint.as_directory() as directory:
        state = load_checkpoint_state(directory, map_location=run.device)
        rows = Path(directory) / METRICS_FILE
        history = json.loads(rows.read_text()) if rows.is_file() else []
    if run.adapter is not None and state.get("adaptive"):  # its B, before the LR is loaded
        run.adapter.resume(state["adaptive"])
    start_epoch = restore_state(state, run.model, run.setup)
    if run.tracker is not None and state.get("target"):
        run.tracker.load_state_dict(state["target"])
    if run.noise is not None and state.get("noise"):  # a resumed run continues its averages
        run.noise.load_state_dict(state["noise"])
    logger.info("rank %d resumes after epoch %d from %s", rank, start_epoch - 1, checkpoint.path)
    return start_epoch, start_epoch - 1, [row for row in history if row["epoch"] < start_epoch]


def epoch_line(row: dict[str, Any], epochs: int | None) -> str:
    """An epoch's line for a person: its loss, accuracy (test, or validation when tuning
    or training to a target, then the target too) and seconds; `epochs`, the count
    planned, when known."""
    shown = [key for key in ("val_accuracy", "test_accuracy") if _known(row.get(key))]
    accuracy = ", ".join(f"{key.removesuffix('_accuracy')} accuracy {row[key]:.4f}"
                         for key in shown)
    if "target_accuracy" in row:
        reached = "reached" if row.get("target_reached") else "not yet"
        accuracy += f" (target {row['target_accuracy']:.4f}: {reached})"
    parts = [f"train loss {row['train_loss']:.4g}" if "train_loss" in row else "", accuracy,
             f"{row['seconds']:.1f} s" if "seconds" in row else ""]
    of = "" if epochs is None else f" of {epochs}"
    return f"epoch {row['epoch'] + 1}{of}: " + ", ".join(p for p in parts if p)


def _known(value: Any) -> bool:
    """A score that is there: not None, not NaN (a run to a target scores its test set at
    its end only)."""
    try:
        return not math.isnan(value)
    except TypeError:  # None: not in the row
        return False


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    """The per-epoch numbers: per-step lists (AGS "variability") stay out of the report."""
    return {key: value for key, value in metrics.items()
            if isinstance(value, (int, float, str, bool)) and not isinstance(value, complex)}


def _report(row: dict[str, Any], state: dict[str, Any] | None, epoch: int,
            history: list[dict[str, Any]]) -> None:
    """Every rank reports (it is a barrier); rank 0 alone writes the checkpoint, and every
    epoch's metrics so far (`history`) beside it."""
    if state is None:
        ray.train.report(row)
        return
    with tempfile.TemporaryDirectory() as directory:
        torch.save(state, Path(directory) / CHECKPOINT_FILE)
        (Path(directory) / METRICS_FILE).write_text(json.dumps(history))
        ray.train.report(row, checkpoint=ray.train.Checkpoint.from_directory(directory),
                         checkpoint_dir_name=f"checkpoint_epoch_{epoch:04d}")


def _maybe_fail(config: dict[str, Any], epoch: int, rank: int) -> None:
    """Test hook: rank 0 raises at the start of `fail_at_epoch`, once across restarts.

    The marker file must be visible to the restarted rank 0: a directory on a
    shared file system (on one machine, any local directory).
    """
    fail_at = config.get("fail_at_epoch")
    if fail_at is None or rank != 0 or epoch != int(fail_at):
        return
    marker = Path(config["fail_marker_dir"]) / FAIL_MARKER
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"failed at epoch {epoch}\n")
    raise InjectedFailure(f"injected failure at epoch {epoch} (fail_at_epoch={fail_at})")


__all__ = ["CHECKPOINT_FILE", "METRICS_FILE", "InjectedFailure", "NOT_RESUMED",
           "load_checkpoint_state", "train_loop_per_worker"]
