"""One training job, as `train` runs it and `tune_training` runs each trial: the plan's
(N, B), the workload and the strategy resolved and checked in the driver before any worker
starts (`resolve_job`, `dry_run`), then the workload checked where the workers run
(`checked_on_worker`). Ray-facing (the check is a Ray task); the training entry's own module.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from trainables.memory_probe import check_workload
from tula_ray.arguments import check_int, named_arguments
from tula_ray.cluster import Workers
from tula_ray.planning.plan import Plan
from tula_ray.precision import profiled_precision_note
from tula_ray.space import check_batch_in_dataset
from tula_ray.training.strategies import (StrategySetup, TrainingStrategy, build_strategy,
                                          get_training_strategy, logger as strategies_logger,
                                          portable_training_strategy)
from tula_ray.training.strategy_base import check_base_optimizer
from tula_ray.workloads import Workload, in_precision, portable_workload, resolve_workload

logger = logging.getLogger(__name__)

PLAN_OPTIONS_KEY = "workload_options"  # where a plan's meta may record the workload's options


@dataclass(frozen=True)
class Job:
    """The validated arguments of one training job (`train`, and each trial of `tune_training`)."""

    spec: str | Workload  # what workers rebuild the workload from
    options: dict[str, Any]
    workload: Workload
    num_workers: int
    global_batch: int
    epochs: int
    strategy: str | TrainingStrategy  # what workers resolve: a registered name or the object
    strategy_options: dict[str, Any]
    notes: tuple[str, ...]

    @property
    def strategy_name(self) -> str:
        return get_training_strategy(self.strategy).name


def resolve_job(plan: Plan, strategy: str | TrainingStrategy, workload: str | Workload | None,
                workload_options: dict[str, Any] | None, epochs: int | None,
                strategy_options: dict[str, Any] | None, precision: str | None = None,
                budget: str = "epochs") -> Job:
    """The job `plan`'s choice (N, B) is trained as: the workload (the plan's, unless one is
    given) and the strategy resolved, the epochs settled, the strategy's own checks of its
    options against N and B run (its notes logged), all in the driver before Ray starts.
    precision: default the plan's (what it was profiled in), else the workload's.
    epochs: default workload_options["epochs"] when given, else the plan's
    `epochs_to_train` (its choice's epochs to target under an objective to an accuracy),
    or under the "scale-invariant" budget the plan's `epochs`: that budget counts them at
    the reference batch, as the plan's `epochs` are."""
    resolved_strategy = get_training_strategy(strategy)
    spec, options, resolved = _workload_of(plan, workload, workload_options)
    # Optional for a search, which times an evaluation pass only when there is one.
    if resolved.test_dataset_fn is None:
        raise ValueError(f"workload {resolved.name!r} has no test_dataset_fn: tula_ray.train "
                         "scores the test set after every epoch; give the Workload a "
                         "test_dataset_fn")
    if epochs is None:
        epochs = _default_epochs(plan, resolved, options, budget)
    check_int("epochs", epochs, minimum=1)
    n, b = plan.choice.num_workers, plan.choice.global_batch
    if b % n:
        raise ValueError(f"the plan's choice B={b} is not divisible by N={n}; B must be a "
                         "multiple of N (was the plan edited by hand?)")
    if resolved.train_size is not None:  # known without data (a built-in): refuse before Ray
        check_batch_fits(b, resolved)
    # The strategy's own option, optimizer and N/B checks (e.g. AGS's sub-batch < B/N), in
    # the driver.
    check_base_optimizer(resolved_strategy, resolved.optimizer_fn, resolved.name)
    strategy_options, notes = named_arguments(resolved_strategy.check, "strategy_options")(
        n, b, dict(strategy_options or {}))
    for note in notes:
        logger.warning("%s", note)
    note = profiled_precision_note(precision, plan.meta.get("precision"))
    if note is not None:
        logger.warning("%s", note)
        notes = [*notes, note]
    if precision is None:
        precision = plan.meta.get("precision")
    spec, options, resolved = in_precision(spec, options, resolved, precision)
    return Job(spec, options, resolved, n, b, epochs, portable_training_strategy(strategy),
               strategy_options, tuple(notes))


def _workload_of(plan: Plan, workload: str | Workload | None,
                 workload_options: dict[str, Any] | None
                 ) -> tuple[str | Workload, dict[str, Any], Workload]:
    """(spec, options, resolved) of the workload trained: the plan's, rebuilt from what it
    records (the user's workload_options added), unless one is given."""
    if workload is None:
        spec = plan.workload
        options = dict(plan.meta.get(PLAN_OPTIONS_KEY) or {})
        if workload_options is not None:
            options.update(workload_options)
        try:
            resolved = resolve_workload(spec, options)
        except (ValueError, TypeError) as exc:
            if workload_options:  # the options the user added are what failed
                raise type(exc)(f"workload_options={workload_options!r}: {exc}") from exc
            if isinstance(exc, TypeError):
                raise
            raise ValueError(
                f"the plan does not record a workload this run can rebuild (it names "
                f"{spec!r}: {exc}); pass workload= (a built-in name or a "
                f"tula_ray.workloads.Workload)") from exc
    else:
        spec, options = workload, dict(workload_options or {})
        resolved = named_arguments(resolve_workload, "workload", "workload_options")(spec, options)
        if resolved.name != plan.workload:
            logger.warning("training %s although the plan was made for %s: its (N, B) "
                           "choice may not fit this workload", resolved.name, plan.workload)
    return spec, options, resolved


def _default_epochs(plan: Plan, workload: Workload, options: dict[str, Any], budget: str) -> int:
    if "epochs" in options:
        return workload.epochs
    if budget == "scale-invariant":
        return plan.epochs
    if plan.epochs_to_train != plan.epochs:
        logger.info("training %d epochs: the plan's epochs to target at B=%d (its %d epochs "
                    "at the reference batch, scaled by the noise scale)", plan.epochs_to_train,
                    plan.choice.global_batch, plan.epochs)
    return plan.epochs_to_train


def check_batch_fits(global_batch: int, workload: Workload) -> None:
    """The plan's B against the workload trained (`space.check_batch_in_dataset`)."""
    check_batch_in_dataset("the plan's global batch B", global_batch, workload.name,
                           workload.dataset_size, hint="; pass workload_options with a "
                           "larger train_subset or fake_size")


def checked_on_worker(job: Job, workers: Workers) -> Job:
    """The job with its workload checked on one worker (`trainables.memory_probe`) and
    completed; a user's Workload travels to the workers completed."""
    workload = check_workload(job.spec, job.options, resources=workers.resources,
                              use_gpu=workers.use_gpu)
    check_batch_fits(job.global_batch, workload)
    spec, options = portable_workload(job.spec, job.options, workload)
    return replace(job, workload=workload, spec=spec, options=options)


def dry_run(job: Job, dataset_size: int) -> StrategySetup:
    """Build the strategy once on a stand-in model, so a bad option value fails here and
    not in every worker, max_failures + 1 times over. dataset_size: the plan's, for the
    steps per epoch a scheduler is built with (the workload's data are not read here).
    Returns what was built (whether it has a gain: `StrategySetup.progress`)."""
    strategy = get_training_strategy(job.strategy)
    # What one process can build of a job of N workers (e.g. AGS's "local" source needs
    # DDP workers): the strategy says (BaseStrategy.one_process_options).
    one_process = getattr(strategy, "one_process_options", None)
    options = dict(job.strategy_options) if one_process is None else one_process(
        job.num_workers, job.global_batch, dict(job.strategy_options))
    steps = max(1, dataset_size // job.global_batch)
    # Its notes describe one process, not the job's N workers: the workers log the real ones.
    with _quiet(strategies_logger):
        return named_arguments(build_strategy, "strategy_options")(
            strategy, nn.Linear(1, 1), global_batch=job.global_batch, steps_per_epoch=steps,
            epochs=job.epochs, options=options, optimizer_fn=job.workload.optimizer_fn)


@contextlib.contextmanager
def _quiet(log: logging.Logger):
    previous = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(previous)
