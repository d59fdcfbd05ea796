"""`tula_ray.tune_training()`: fair tuning of a training strategy at a Plan's (N, B).

    best = tula_ray.tune_training(plan, strategy="lrs", trials=16, epochs=20)
    result = tula_ray.train(plan, **best.config)     # the test set is used here, first

The paper's §VI future work (DESIGN "Beyond the paper"): Ray Tune's `OptunaSearch`
samples the strategy's search space (`TrainingStrategy.search_space`: the LR for
every strategy, LARS's trust coefficient, AGS's delta, gain exponent and cap) and
`ASHAScheduler` stops poor trials early. Each trial is one Ray Train job at the
plan's N and B (`trainables.tuning_trial`), judged every epoch by its accuracy on
a split held out of the TRAINING set (`validation_fraction`); the test set stays
untouched. Give every strategy the same `trials` for a fair comparison.

The tuning entry point (Ray-facing); it never imports the search entry point. Every
argument is checked before Ray starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from trainables.tuning_trial import METRIC, tune_trial
from tula_ray.arguments import (check_bool, check_choice, check_int, check_mapping, check_number,
                                check_text)
from tula_ray.cluster import (alive_node_resources, check_runtime_env, cluster_for_run,
                              groups_that_fit, trial_resources)
from tula_ray.planning.plan import Plan
from tula_ray.runs.training_job import checked_on_worker, dry_run, resolve_job
from tula_ray.training.budget import BUDGETS, budget_for
from tula_ray.training.strategies import (TRAINING_STRATEGY_DEFAULT, TrainingStrategy,
                                          get_training_strategy)
from tula_ray.workloads import Workload

logger = logging.getLogger(__name__)

TRIALS_DEFAULT = 16  # the same budget for every strategy (issue 12)
VALIDATION_FRACTION_DEFAULT = 0.2  # of the training set, held out to judge trials
ASHA_REDUCTION_FACTOR = 3  # ASHA's default (Li et al.): keep the best third at each rung
EPOCH_TIME = "training_iteration"  # ASHA's clock: one report per epoch
PROGRESS_TIME = "progress_epochs"  # ... or the scale-invariant progress, in reference epochs
MODE = "max"
KINDS = {"loguniform": tune.loguniform, "uniform": tune.uniform, "choice": tune.choice}


@dataclass
class TuneResult:
    """What `tune_training` returns.

    config: the best configuration as `tula_ray.train` keyword arguments
        (strategy, lr, strategy_options): `train(plan, **result.config)`.
    val_accuracy: its accuracy on the held-out split after the last epoch.
    trials: one row per trial (Tune's dataframe: sampled config/..., val_accuracy, epoch).
    """

    config: dict[str, Any]
    val_accuracy: float
    trials: pd.DataFrame
    result_grid: Any


def tune_training(plan: Plan | str | Path,
                  strategy: str | TrainingStrategy = TRAINING_STRATEGY_DEFAULT, *,
                  trials: int = TRIALS_DEFAULT, epochs: int | None = None,
                  workload: str | Workload | None = None,
                  workload_options: dict[str, Any] | None = None,
                  validation_fraction: float = VALIDATION_FRACTION_DEFAULT, seed: int = 0,
                  grace_period: int | None = None, storage_path: str | None = None,
                  name: str | None = None, use_gpu: bool | None = None,
                  address: str | None = None,
                  runtime_env: dict[str, Any] | None = None,
                  budget: str = "epochs") -> TuneResult:
    """Tune `strategy` at the plan's chosen N and B; return the best configuration.

    trials: sampled configurations (Optuna's TPE), each a Ray Train job of `epochs`.
    grace_period: epochs every trial runs before ASHA may stop it (default epochs // 4).
    workload, workload_options, epochs: as `tula_ray.train`. seed: every trial's.
    address: the Ray cluster to join, as `tula_ray.train`'s; on a multi-node cluster
      storage_path must be one every node reaches (checked, as `tula_ray.train` does).
    runtime_env: the Ray runtime environment every trial and worker inherits, as
      `tula_ray.train`'s.
    budget: as `tula_ray.train`'s. "scale-invariant", for a strategy with a gain (AGS-NS):
      every trial trains until its progress reaches `epochs` at the reference batch, and
      ASHA counts that progress (`progress_epochs`), not epochs, so trials are compared
      at equal progress; grace_period is then in those epochs. A strategy without a gain
      keeps its epochs (a warning says so).
    Raises ValueError for a bad argument, before Ray starts; the workload is checked on
    one worker before any trial (a UserCodeError when its own code fails there).
    """
    check_int("trials", trials, minimum=1)
    check_int("epochs", epochs, minimum=1, optional=True)
    check_int("grace_period", grace_period, minimum=1, optional=True)
    check_mapping("workload_options", workload_options)
    check_number("validation_fraction", validation_fraction, low=0.0, high=1.0,
                 low_open=True, high_open=True)
    check_int("seed", seed)
    check_bool("use_gpu", use_gpu, optional=True)
    for label, value in (("storage_path", storage_path), ("name", name), ("address", address)):
        check_text(label, value, optional=True)
    check_runtime_env(runtime_env)
    check_choice("budget", budget, BUDGETS)
    plan = plan if isinstance(plan, Plan) else Plan.from_json(plan)
    job = resolve_job(plan, strategy, workload, workload_options, epochs, {})
    grace = max(1, job.epochs // 4) if grace_period is None else grace_period
    check_int("grace_period", grace, minimum=1)
    if grace > job.epochs:
        raise ValueError(f"grace_period={grace} exceeds the {job.epochs} epochs of a trial")
    space = _search_space(get_training_strategy(job.strategy), job.global_batch)
    built = dry_run(job, plan.dataset_size)
    _, note = budget_for(budget, job.epochs, built.progress(), plan.dataset_size)
    if note:
        logger.warning("%s", note)
    time_attr = PROGRESS_TIME if budget == "scale-invariant" and not note else EPOCH_TIME
    # Refuses a cluster too small for N (or asks its autoscaler), as `train` does; every
    # trial's checkpoints must reach the driver (the storage check).
    with cluster_for_run(job.num_workers, address=address, runtime_env=runtime_env,
                         use_gpu=use_gpu, storage_path=storage_path) as workers:
        job = checked_on_worker(job, workers)
        fixed = {"workload": job.spec, "workload_options": job.options,
                 "num_workers": job.num_workers, "global_batch": job.global_batch,
                 "epochs": job.epochs, "strategy": job.strategy,
                 "strategy_options": job.strategy_options, "seed": seed,
                 "validation_fraction": validation_fraction, "budget": budget,
                 "use_gpu": workers.use_gpu, "resources": workers.resources,
                 # placed as the search profiled N: N <= G on one node (issue 26)
                 "workers_per_node": workers.workers_per_node}
        grid = _tuner(job, fixed, space, trials, asha(job.epochs, grace, time_attr), seed,
                      storage_path, name).fit()
    return _best(grid, job, time_attr)


def _search_space(strategy: TrainingStrategy, global_batch: int) -> dict[str, Any]:
    """The strategy's plain search space as Ray Tune domains; keys: "lr" and its options."""
    described = strategy.search_space(global_batch)
    unknown = sorted(set(described) - {"lr", *strategy.options})
    if unknown:
        raise ValueError(f"strategy {strategy.name!r} tunes {unknown[0]!r}, which is neither "
                         f"'lr' nor one of its options {list(strategy.options)}")
    space = {}
    for key, (kind, *arguments) in described.items():
        if kind not in KINDS:
            raise ValueError(f"search space of {strategy.name!r}: {key} has kind {kind!r}; "
                             f"use one of {sorted(KINDS)}")
        space[key] = KINDS[kind](*arguments)
    return space


def asha(epochs: int, grace: int, time_attr: str = EPOCH_TIME) -> ASHAScheduler:
    """ASHA over a trial's `epochs`, counted in reported epochs (`training_iteration`) or,
    for a scale-invariant budget, in the progress's epochs at the reference batch."""
    return ASHAScheduler(time_attr=time_attr, max_t=epochs, grace_period=grace,
                         reduction_factor=ASHA_REDUCTION_FACTOR)


def _tuner(job: Any, fixed: dict[str, Any], space: dict[str, Any], trials: int,
           scheduler: ASHAScheduler, seed: int, storage_path: str | None,
           name: str | None) -> tune.Tuner:
    name = name or (f"tula-tune-{job.workload.name}-{job.strategy_name}-N{job.num_workers}"
                    f"-B{job.global_batch}-{datetime.now():%Y%m%d-%H%M%S}")
    logger.info("tuning %s at N=%d, B=%d: %d trials of %d epochs (run %s)", job.strategy_name,
                job.num_workers, job.global_batch, trials, job.epochs, name)
    trainable = tune.with_resources(tune.with_parameters(tune_trial, fixed=fixed),
                                    trial_resources())
    return tune.Tuner(
        trainable, param_space=space,
        tune_config=tune.TuneConfig(
            metric=METRIC, mode=MODE, num_samples=trials,
            search_alg=OptunaSearch(seed=seed),
            scheduler=scheduler,
            # N workers per trial: as many trials at once as the cluster holds groups of N
            # of the provisioned workers (the same shape every trial asks for), each placed
            # as a trial places it (N <= G on one node), at least one.
            max_concurrent_trials=max(1, groups_that_fit(
                fixed["resources"], job.num_workers, fixed["workers_per_node"],
                alive_node_resources()))),
        run_config=tune.RunConfig(name=name, storage_path=storage_path))


def finished(metrics: dict[str, Any] | None, epochs: int, time_attr: str = EPOCH_TIME) -> bool:
    """Whether a trial's last report ends its budget: its last epoch, or, counted in
    progress, `epochs` at the reference batch reached."""
    if not metrics:
        return False
    if time_attr == PROGRESS_TIME:
        return metrics.get(PROGRESS_TIME, 0.0) >= epochs * (1 - 1e-9)
    return metrics.get("epoch") == epochs - 1


def _best(grid: Any, job: Any, time_attr: str = EPOCH_TIME) -> TuneResult:
    """The trial with the best last-epoch validation accuracy among those that ran their
    whole budget (ASHA stops the others early; a stopped trial's early score is not
    comparable)."""
    frame = grid.get_dataframe()
    finished_trials = [r for r in grid if finished(r.metrics, job.epochs, time_attr)]
    candidates = finished_trials or [r for r in grid if r.metrics and METRIC in r.metrics]
    if not candidates:
        raise RuntimeError(f"no tuning trial reported {METRIC}; see the trials' errors:\n{frame}")
    best = max(candidates, key=lambda r: r.metrics[METRIC])
    sampled = dict(best.config)
    lr = sampled.pop("lr", None)
    config = {"strategy": job.strategy_name if isinstance(job.strategy, str) else job.strategy,
              "lr": lr, "strategy_options": {**job.strategy_options, **sampled}}
    return TuneResult(config, float(best.metrics[METRIC]), frame, grid)
