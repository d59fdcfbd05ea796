"""A training run assembled (`prepare_run`: the workload, its loaders, the model on its
device, the strategy built), as Ray Train workers (trainables/training_loop.py) and `fit`
set it up; `fit` trains one in this process, without Ray (the generalization benchmark's
runs, the tests, a Ray-free GPU check). Each epoch is tula_ray.training.epochs's; epochs
are counted from 0 (as torch's `set_epoch` and Ray Train loops do). No Ray here (core).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pandas as pd
import torch
from torch import nn

from tula_ray.arguments import check_int
from tula_ray.distributed import max_over_ranks
from tula_ray.evaluation_schedule import (VALIDATION_FRACTION_DEFAULT, evaluation_interval,
                                          held_out_size)
from tula_ray.failures import workload_code
from tula_ray.precision import set_math_mode
from tula_ray.training.batch_adapter import BatchAdapter
from tula_ray.training.batch_controller import AdaptiveBatch
from tula_ray.training.batches import Batches
from tula_ray.training.budget import Budget, budget_for
from tula_ray.training.data import make_loaders, test_batches
from tula_ray.training.epochs import evaluate, train_epoch
from tula_ray.training.host_allocator import steady_host_allocator
from tula_ray.training.measure import StepTimer
from tula_ray.training.online_noise import NOISE_METRICS, OnlineNoise, captured_comm_hook
from tula_ray.training.strategies import (TRAINING_STRATEGY_DEFAULT, StrategySetup,
                                          TrainingStrategy, build_strategy, get_training_strategy)
from tula_ray.training.strategy_base import describe_optimizer
from tula_ray.training.target import TARGET_SUMMARY, Target, TargetTracker, check_target
from tula_ray.workloads import Workload, resolve_workload

logger = logging.getLogger(__name__)

# "optimizer" names what trained, e.g. "TulaOptimizer(Adam)": the workload's own optimizer.
COLUMNS = ("epoch", "strategy", "optimizer", "global_batch", "seed", "train_loss", "train_accuracy",
           "test_loss", "test_accuracy", "lr", "seconds", "scaled_fraction", "variability_median",
           "loss_scale", "progress", *NOISE_METRICS)
# A run to a target (`fit(target_accuracy=)`) adds these: its last validation scores,
# the evaluations' seconds, and `TargetTracker.summary`'s figures (their count is the
# length of `.attrs["evaluations"]`).
TARGET_COLUMNS = ("val_loss", "val_accuracy", "val_seconds",
                  *(key for key in TARGET_SUMMARY if key != "evaluations"))


@dataclass
class Run:
    """Everything one training process needs, as `prepare_run` builds it."""

    workload: Workload
    model: nn.Module
    setup: StrategySetup
    train_loader: Batches
    test_loader: Batches
    loss_fn: Callable
    device: torch.device
    epochs: int  # the most epochs the budget allows
    budget: Budget = Budget()
    tracker: TargetTracker | None = None  # a run to a target: test_loader is the validation
    num_replicas: int = 1  # this process is rank `rank` of `num_replicas`
    rank: int = 0
    # The gradient noise scale measured while training (`tula_ray.training.online_noise`):
    # every epoch's metrics and every evaluation of a run to a target carry NOISE_METRICS.
    noise: OnlineNoise | None = None
    # An adaptive global batch (`tula_ray.training.batch_adapter`): B changes while training.
    adapter: BatchAdapter | None = None

    def train_epochs(self, start: int = 0, *, before: Callable[[int], None] | None = None
                     ) -> Iterator[tuple[int, dict[str, Any]]]:
        """The epoch loop every trainer shares (`fit`, Ray Train's workers, the
        generalization benchmark): from epoch `start` (after a resume) to the last, each
        epoch trained (`train_epoch`) and then scored on the evaluation set (`evaluate`).
        A scale-invariant budget ends the loop once the progress reaches its target (read
        before each epoch: a resumed run that had reached it trains no more).
        Yields (epoch, metrics); `before(epoch)` runs before an epoch starts."""
        if self.tracker is not None:
            self.tracker.start()
        for epoch in range(start, self.epochs):
            if self._budget_spent():
                return
            if before is not None:
                before(epoch)
            metrics = self._train(epoch)
            if self.tracker is None:
                metrics.update(self._evaluate(self.test_loader, "test"))
                yield epoch, metrics
                continue
            metrics.update(self._to_target(epoch))
            yield epoch, metrics
            if self.tracker.reached_at is not None:
                return

    def _budget_spent(self) -> bool:
        """Whether a scale-invariant budget's progress is reached (read before each epoch:
        a resumed run that had reached it trains no more)."""
        progress = self.setup.progress() if self.budget.scale_invariant else None
        return self.budget.reached(None if progress is None else progress[0])

    def _train(self, epoch: int) -> dict[str, Any]:
        """One epoch trained; a run to a target evaluates its validation split at its
        intervals and stops at the target (those evaluations are out of `seconds`)."""
        after_step = self._after_step(epoch)
        with workload_code(self.workload.name,
                           f"training at local batch {self.train_loader.batch}"):
            metrics = train_epoch(self.model, self.setup, self.loss_fn, self.train_loader,
                                  self.device, epoch=epoch, after_step=after_step,
                                  before_step=None if self.noise is None
                                  else self.noise.before_step)
        metrics.update(self.noise_metrics())
        if self.adapter is not None:  # the B the epoch ended at, and the switches so far
            metrics["global_batch"] = self.adapter.global_batch
            metrics["local_batch"] = self.adapter.global_batch // self.num_replicas
            metrics["batch_switches"] = len(self.adapter.controller.switches())
        if self.tracker is not None:
            metrics["val_seconds"] = self.tracker.take_epoch_eval_seconds()
            metrics["seconds"] -= metrics["val_seconds"]
        if "progress" in metrics:  # a strategy with a gain: its epochs at the reference
            metrics["progress_epochs"] = self.budget.epochs_done(metrics["progress"])
        return metrics

    def _after_step(self, epoch: int) -> Callable[[], bool] | None:
        """What runs after every step: the target's count (True: reached, stop), then the
        adaptive batch's (a decision at its intervals, for the steps after; recorded at
        the last one too, every rank taking part)."""
        tracker, adapter = self.tracker, self.adapter
        if tracker is None and adapter is None:
            return None

        def after_step() -> bool:
            reached = tracker is not None and tracker.after_step(epoch)
            if adapter is not None:
                adapter.after_step()
            return reached
        return after_step

    def _evaluate(self, loader: Batches, prefix: str) -> dict[str, float]:
        """`loader`'s loss and accuracy as `{prefix}_loss` and `{prefix}_accuracy`, and
        `eval_seconds`: what the plan's eval_time_s predicts (the slowest rank's: they all
        wait for it). Evaluation runs at its own batch (`data.evaluation_batch`)."""
        with StepTimer(self.device) as timer, workload_code(
                self.workload.name, f"evaluation at batch {loader.batch}"):
            scores = evaluate(self.model, loader, self.device, self.loss_fn,
                              autocast=self.setup.autocast)
        (seconds,) = max_over_ranks([timer.seconds], self.device)
        return {f"{prefix}_loss": scores["test_loss"],
                f"{prefix}_accuracy": scores["test_accuracy"], "eval_seconds": seconds}

    def _to_target(self, epoch: int) -> dict[str, Any]:
        """A run to a target, after an epoch: its last validation scores and its summary;
        at its end (the target reached, or no epoch left) the test set, read this once."""
        tracker = self.tracker
        metrics: dict[str, Any] = {**tracker.latest(), **tracker.summary()}
        last = (tracker.reached_at is not None or epoch == self.epochs - 1
                or self._budget_spent())
        if last:
            test = test_batches(self.workload, self.train_loader.batch,
                                num_replicas=self.num_replicas, rank=self.rank,
                                device=self.device)
            metrics.update(self._evaluate(test, "test"))
        return metrics

    def noise_metrics(self) -> dict[str, float]:
        """The online noise scale's `NOISE_METRICS` now (`OnlineNoise.read`: every rank at
        the same point); NaN without an estimator."""
        return dict.fromkeys(NOISE_METRICS, math.nan) if self.noise is None \
            else self.noise.read()

    def validation_scores(self) -> dict[str, float]:
        """The validation split's val_loss and val_accuracy (a run to a target: its
        evaluation loader is the validation split), with the online noise scale's
        `NOISE_METRICS` at that point (each evaluation's row carries them)."""
        scores = self._evaluate(self.test_loader, "val")
        return {"val_loss": scores["val_loss"], "val_accuracy": scores["val_accuracy"],
                **self.noise_metrics()}


def prepare_run(workload: str | Workload, *, global_batch: int,
                strategy: str | TrainingStrategy = TRAINING_STRATEGY_DEFAULT,
                epochs: int | None = None,
                seed: int = 0, device: torch.device | str = "cpu",
                options: dict[str, Any] | None = None, lr: float | None = None,
                num_replicas: int = 1, rank: int = 0,
                wrap_model: Callable[[nn.Module], nn.Module] | None = None,
                validation_fraction: float = 0.0, budget: str = "epochs",
                target_accuracy: float | None = None,
                eval_every_samples: int | None = None,
                adaptive: AdaptiveBatch | None = None) -> Run:
    """The model, strategy and loaders of one process of a run: shared by `fit` (one
    process) and the Ray Train worker loop (rank `rank` of `num_replicas`).

    wrap_model: puts the fresh model on its device and wraps it (Ray's `prepare_model`:
    DDP); default: `.to(device)`. The batches come on `device` by the one data path
    (`tula_ray.training.batches`), the one the profile timed.
    validation_fraction > 0: train on the rest of the training set and evaluate on that
    held-out share of it instead of the test set (see `make_loaders`; the workload's own
    `val_dataset_fn` when it has one).
    target_accuracy: train until the validation accuracy reaches it, evaluated every
    `eval_every_samples` (default about a quarter epoch; `tula_ray.training.target`), the
    test set read once, at the end; validation_fraction defaults to
    `VALIDATION_FRACTION_DEFAULT` then.
    The seed fixes the initial weights (the same on every rank) and the data order.
    budget: "epochs" (train `epochs`), or "scale-invariant": train until AdaScale's
    progress reaches `epochs` at the strategy's reference batch (`tula_ray.training.budget`;
    a strategy without a gain trains its epochs, and a note says so).
    adaptive: an adaptive global batch (`tula_ray.training.batch_controller`), starting at
    `global_batch` (its `start`): B is chosen again every `eval_every_samples` (default
    about a quarter epoch at the start B). The strategy is built at the largest allowed B
    (AGS-NS then wraps the workload's optimizer at every B) and moved to the start.
    """
    workload = resolve_workload(workload)
    epochs = workload.epochs if epochs is None else epochs
    check_target(target_accuracy, eval_every_samples, adaptive is not None)
    if target_accuracy is not None:
        validation_fraction = validation_fraction or VALIDATION_FRACTION_DEFAULT
    built_at = _adaptive_build_batch(adaptive, global_batch, num_replicas)
    _epoch_size(workload, built_at, num_replicas, validation_fraction)  # its largest B fits too
    train_size, steps_per_epoch = _epoch_size(workload, global_batch, num_replicas,
                                              validation_fraction)
    device = torch.device(device)
    steady_host_allocator()  # the steps the profile timed, from the first (host_allocator)
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP also broadcasts them)
    model = workload.model_fn()
    model = model.to(device) if wrap_model is None else wrap_model(model)
    # Built before the data load so that a bad strategy or option fails at once. The
    # workload's own optimizer (at `lr` when one is given): what the user wrote trains.
    # The comm hook it registers is wrapped by the online noise scale's (attached below).
    with captured_comm_hook(model) as comm_hook:
        setup = build_strategy(get_training_strategy(strategy), model,
                               global_batch=built_at, steps_per_epoch=steps_per_epoch,
                               epochs=epochs, options=options,
                               optimizer_fn=workload.optimizer_fn, lr=lr)
    budget_, note = budget_for(budget, epochs, setup.progress(), train_size)
    if note:
        logger.warning("%s", note)
        setup.notes.append(note)
    # The workload's precision, as the profile measured it (`tula_ray.precision`).
    set_math_mode(workload.precision)
    setup.set_precision(workload.precision, device)
    train_loader, test_loader = make_loaders(
        workload, global_batch // num_replicas, seed=seed, num_replicas=num_replicas, rank=rank,
        device=device, validation_fraction=validation_fraction)
    run = Run(workload, model, setup, train_loader, test_loader, workload.loss_fn(), device,
              budget_.max_epochs(global_batch), budget_, num_replicas=num_replicas, rank=rank)
    run.noise = OnlineNoise.attach(model, setup, run.loss_fn, global_batch // num_replicas,
                                   comm_hook)
    if run.noise.note:
        setup.notes.append(run.noise.note)
    interval = evaluation_interval(eval_every_samples, global_batch, steps_per_epoch)
    if target_accuracy is not None:
        run.tracker = TargetTracker(Target(target_accuracy, interval), global_batch,
                                    run.validation_scores)
    if adaptive is not None:
        run.adapter = BatchAdapter(adaptive, every_samples=interval * global_batch,
                                   num_replicas=num_replicas, rank=rank,
                                   loader=train_loader, setup=setup, noise=run.noise,
                                   tracker=run.tracker)
        run.adapter.start(built_at)
    return run


def _adaptive_build_batch(adaptive: AdaptiveBatch | None, global_batch: int,
                          num_replicas: int) -> int:
    """The B a run's strategy is built at: `global_batch`, or for an adaptive batch
    (which must start there, every allowed B a multiple of N) its largest."""
    if adaptive is None:
        return global_batch
    if adaptive.start != global_batch:
        raise ValueError(f"global_batch={global_batch}, but the adaptive batch starts at "
                         f"{adaptive.start}: give its start")
    batches = [option.global_batch for option in adaptive.options]
    uneven = [batch for batch in batches if batch % num_replicas]
    if uneven:
        raise ValueError(f"the adaptive batch's {uneven} are not multiples of the "
                         f"{num_replicas} workers: every global batch must divide evenly")
    return max(batches)


def _epoch_size(workload: Workload, global_batch: int, num_replicas: int,
                validation_fraction: float) -> tuple[int, int]:
    """(training samples, steps per epoch) of a run: the training set less the validation
    split held out of it (none when the workload has its own)."""
    check_int("global_batch", global_batch, minimum=1)
    if global_batch % num_replicas:
        raise ValueError(f"global_batch={global_batch} is not divisible by num_workers="
                         f"{num_replicas}; B must be a multiple of N")
    train_size = workload.dataset_size
    if validation_fraction and workload.val_dataset_fn is None:
        train_size -= held_out_size(train_size, validation_fraction)
    # Equal to len(train loader) per rank: floor(floor(D / N) / (B / N)) = floor(D / B).
    steps_per_epoch = train_size // global_batch
    if steps_per_epoch < 1:
        raise ValueError(f"global_batch={global_batch} exceeds the training set of "
                         f"{workload.name} ({workload.dataset_size} samples): no full batch")
    return train_size, steps_per_epoch


def fit(workload: str | Workload, *, global_batch: int,
        strategy: str | TrainingStrategy = TRAINING_STRATEGY_DEFAULT,
        epochs: int | None = None, seed: int = 0,
        device: torch.device | str = "cpu", options: dict[str, Any] | None = None,
        lr: float | None = None,
        on_epoch: Callable[[dict[str, Any], nn.Module, StrategySetup], None] | None = None,
        budget: str = "epochs", target_accuracy: float | None = None,
        eval_every_samples: int | None = None, validation_fraction: float = 0.0,
        adaptive: AdaptiveBatch | None = None) -> pd.DataFrame:
    """Train `workload` in this process (world size 1, no Ray) and score it every epoch.

    Args:
        workload: a Workload or a built-in name (`tula_ray.workloads.get_workload`).
        global_batch: samples per optimizer step.
        strategy, options: a registered strategy name or a TrainingStrategy, and its
            options (see `tula_ray.training.strategies`).
        epochs: default the workload's.
        budget: "epochs", or "scale-invariant": until AdaScale's progress reaches `epochs`
            at the strategy's reference batch (see `prepare_run`).
        seed: seeds the model initialisation and the data order.
        lr: the base LR before any strategy scaling; None = the workload's (paper: 0.01).
        on_epoch: called after every epoch with (metrics, model, setup); metrics is the
            row plus train_epoch's extras (e.g. "variability" for ags), e.g. to checkpoint.
        target_accuracy, eval_every_samples, validation_fraction: train until the
            validation split's accuracy reaches the target (see `prepare_run`).
        adaptive: an adaptive global batch starting at `global_batch` (see `prepare_run`).
    Returns:
        One row per epoch with `COLUMNS`; scaled_fraction and variability_median are
        NaN except for ags, progress except for AGS-NS (its reference-batch steps so far);
        noise_scale, grad_sqr and grad_var the gradient noise scale measured while
        training (`tula_ray.training.online_noise`), at the epoch's end.
        `.attrs["notes"]` holds the strategy's notes. A run to a target adds
        `TARGET_COLUMNS` (test_* on its last row only: the test set is read once), and
        `.attrs["target"]` (`TargetTracker.summary`), `.attrs["evaluations"]` (a frame,
        one row per evaluation of the validation split). An adaptive batch: global_batch
        is each epoch's last B, and `.attrs["batch_schedule"]` every decision (a frame).
    """
    run = prepare_run(workload, global_batch=global_batch, strategy=strategy, epochs=epochs,
                      seed=seed, device=device, options=options, lr=lr, budget=budget,
                      target_accuracy=target_accuracy, eval_every_samples=eval_every_samples,
                      validation_fraction=validation_fraction, adaptive=adaptive)
    columns = COLUMNS + (TARGET_COLUMNS if run.tracker is not None else ())
    rows = []
    for epoch, metrics in run.train_epochs():
        row = {"epoch": epoch, "strategy": run.setup.name,
               "optimizer": describe_optimizer(run.setup.optimizer),
               "global_batch": metrics.get("global_batch", global_batch),
               "seed": seed, **{key: metrics.get(key, math.nan) for key in columns[5:]}}
        rows.append(row)
        logger.info("%s %s B=%d epoch %d: train loss %.4f, test accuracy %.4f (%.1f s)",
                    run.workload.name, run.setup.name, global_batch, epoch, row["train_loss"],
                    row["test_accuracy"], row["seconds"])
        if on_epoch is not None:
            on_epoch({**metrics, **row}, run.model, run.setup)
    frame = pd.DataFrame(rows, columns=list(columns))
    frame.attrs["notes"] = list(run.setup.notes)
    if run.tracker is not None:
        frame.attrs["target"] = run.tracker.summary()
        frame.attrs["evaluations"] = pd.DataFrame(run.tracker.evaluations)
    if run.adapter is not None:
        frame.attrs["batch_schedule"] = pd.DataFrame(run.adapter.controller.schedule)
    return frame


# --------------------------------------------------------------------------- helpers

