"""The Tune trial of `tula_ray.tune_training`: one Ray Train job at the plan's (N, B).

Train V2 pattern (NOTES-ENV), as in `trainables.profiling_trial`: a Tune function
trainable builds and fits a `TorchTrainer` running the training worker loop
(`trainables.training_loop.train_loop_per_worker`, the loop `tula_ray.train` runs)
in validation mode, and forwards each epoch's report to Tune
(`trainables.tune_reports.TuneReports`), so ASHA can stop it early. The trial holds
the custom `train_driver` resource, not a CPU (`tula_ray.cluster.trial_resources`).
"""

from __future__ import annotations

import logging
from typing import Any

from ray import tune
from ray.train import ControllerError, FailureConfig, RunConfig
from ray.train.torch import TorchTrainer

from trainables.training_loop import train_loop_per_worker
from trainables.tune_reports import TuneReports
from tula_ray.cluster import (WORKER_GROUP_START_RETRIES, prompt_train_polls, scaling_config,
                              without_preemption_watcher)

logger = logging.getLogger(__name__)

METRIC = "val_accuracy"  # what ASHA and Optuna read: accuracy on the held-out split
FAILED_ACCURACY = 0.0  # reported by a trial whose training crashed: a bad sample, not a crash


def tune_trial(config: dict[str, Any], fixed: dict[str, Any]) -> None:
    """Tune function trainable: train with the sampled `config` ("lr" and strategy options).

    fixed (through `tune.with_parameters`): workload, workload_options, num_workers,
    global_batch, epochs, strategy, strategy_options, seed, validation_fraction, budget,
    use_gpu, resources (one worker's, as `tula_ray.cluster.provision_workers` settled them),
    workers_per_node (G, as it settled it: N <= G on one node, as the search profiled N).
    """
    sampled = dict(config)
    lr = sampled.pop("lr", None)
    loop_config = {
        "workload": fixed["workload"], "workload_options": fixed["workload_options"],
        "global_batch": fixed["global_batch"], "epochs": fixed["epochs"],
        "strategy": fixed["strategy"], "seed": fixed["seed"], "lr": lr,
        "strategy_options": {**fixed["strategy_options"], **sampled},
        "validation_fraction": fixed["validation_fraction"], "checkpoint": False,
        "budget": fixed.get("budget", "epochs")}
    reports = TuneReports()  # every report from this thread, the epochs' included
    trainer = _trainer(loop_config, fixed, reports.callbacks)
    prompt_train_polls()
    without_preemption_watcher()  # a failed configuration is a result, never restarted
    try:
        reports.fit(trainer)
    except ControllerError:
        # Not the configuration's fault (its workers never started): the trial errors, so
        # Tune shows the error and Optuna records a failed trial, not a score of 0.
        raise
    except Exception as exc:  # noqa: BLE001 - a crashing configuration never ends the tuning
        logger.warning("tuning trial %s failed: %s: %s", config, type(exc).__name__, exc)
        tune.report({METRIC: FAILED_ACCURACY, "epoch": -1,
                     "error": f"{type(exc).__name__}: {exc}"})


def _trainer(loop_config: dict[str, Any], fixed: dict[str, Any],
             callbacks: list) -> TorchTrainer:
    """The trial's TorchTrainer, reporting through `callbacks` (`TuneReports`')."""
    return TorchTrainer(
        train_loop_per_worker, train_loop_config=loop_config,
        scaling_config=scaling_config(int(fixed["num_workers"]), fixed["resources"],
                                      fixed.get("workers_per_node")),
        run_config=RunConfig(name="train", storage_path=tune.get_context().get_trial_dir(),
                             callbacks=callbacks,
                             # A failed configuration is a result (accuracy 0), not a retry.
                             failure_config=FailureConfig(
                                 max_failures=0,
                                 controller_failure_limit=WORKER_GROUP_START_RETRIES)))
