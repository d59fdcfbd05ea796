"""The Tune experiment of a search (DESIGN "Data flow" step 3), and resuming it.

One trial per cluster size and round, one at a time, driven by `TulaSearcher`. The
searcher's state (rows measured, queue, round) and the search's resume record (the
memory probe's result and the grid it bounded) are saved with the experiment, so a search
whose driver died continues with `Tuner.restore` (issue 13, item 2): the finished
candidates keep their rows, the interrupted sweep's missing batches are profiled, and
the plan is built from the same rows an uninterrupted search would have had.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import fields
from datetime import datetime
from typing import Any, Iterator

from ray import tune

from searchers import TulaSearcher
from searchers.search_progress import SearchProgress
from searchers.tula_searcher import METRIC, MODE
from trainables.profiling_trial import trainable_with_resources
from tula_ray.models.batch_limit import BatchLimit
from tula_ray.models.memory import MemoryParams
from tula_ray.planning.bounds import MemoryProbe, SearchBounds
from tula_ray.space import SearchSpace
from tula_ray.training.profile_settings import (FIRST_NESTED_KEYS, PROFILE_SETTINGS_KEY,
                                                ProfileSettings)
from tula_ray.verbosity import ray_log_level, tune_verbosity

logger = logging.getLogger(__name__)

# What a resumed search must share with the one it continues (else it is another search).
SAME_SEARCH_KEYS = ("workload", "cluster_sizes", "min_batch", "max_batch", "strategy",
                    "strategy_options", "objective", "training_strategy", "training_options")
# The saved context's key naming its trials' layout of the settings: PROFILE_SETTINGS_KEY
# (one dict); absent from a search saved before (each setting at the top of the config).
SETTINGS_LAYOUT_KEY = "trial_settings"
# ... and the names of the settings in that dict; absent from a search saved before it
# recorded them (their names then: FIRST_NESTED_KEYS).
SETTINGS_NAMES_KEY = "trial_setting_names"
# Ray Tune's switch between its output engines (documented in Tune's output guide). Its new
# engine prints the experiment's box and paths even at verbose 0; its former one prints
# nothing at 0 but errors and warnings.
TUNE_NEW_OUTPUT_ENV = "RAY_AIR_NEW_OUTPUT"


def experiment_name(name: str | None, workload_name: str) -> str:
    return name or f"tula-{workload_name}-{datetime.now():%Y%m%d-%H%M%S}"


def storage_root(storage_path: str | None) -> str:
    """The storage Tune and Ray Train keep runs in: `storage_path`, else Ray's default
    (~/ray_results on the driver's node)."""
    return str(tune.RunConfig(storage_path=storage_path).storage_path).rstrip("/")


def experiment_path(storage_path: str | None, name: str) -> str:
    """Where Tune keeps the experiment `name` (Tune's default storage when None)."""
    return f"{storage_root(storage_path)}/{name}"


def saved_search(path: str) -> TulaSearcher | None:
    """The searcher of the experiment at `path` as last saved, or None if there is none."""
    if not tune.Tuner.can_restore(path):
        return None
    try:
        return TulaSearcher.from_experiment(path)
    except (FileNotFoundError, RuntimeError):  # Tune saved the experiment, not yet the searcher
        return None


def check_same_search(saved: dict[str, Any], request: dict[str, Any], path: str) -> None:
    """A resumed search continues the one at `path`: the arguments that define it must match."""
    differ = [k for k in SAME_SEARCH_KEYS if saved.get(k) != request.get(k)]
    if differ:
        details = "; ".join(f"{k}: saved {saved.get(k)!r}, now {request.get(k)!r}"
                            for k in differ)
        raise ValueError(f"resume=True continues the search saved at {path}, but these "
                         f"arguments differ from it: {details}. Pass the same arguments, or a "
                         "new name= to start another search")


def resume_record(bounds: SearchBounds, use_gpu: bool, probe_s: float,
                  request: dict[str, Any]) -> dict[str, Any]:
    """What a resumed search needs besides the rows, as JSON: the probe's result and grid."""
    space, probe = bounds.space, bounds.probe
    return {"request": request, "space": [list(space.cluster_sizes), list(space.batch_sizes)],
            "memory": probe.params.to_dict(), "max_local_batch": probe.max_local_batch,
            "batch_limit": None if probe.batch_limit is None else probe.batch_limit.to_dict(),
            "memory_probe": probe.rows, "device_memory_bytes": bounds.device_memory_bytes,
            "use_gpu": use_gpu, "probe_wall_s": probe_s,
            SETTINGS_LAYOUT_KEY: PROFILE_SETTINGS_KEY,
            SETTINGS_NAMES_KEY: [setting.name for setting in fields(ProfileSettings)]}


def trial_param_space(settings: ProfileSettings, saved: TulaSearcher | None) -> dict[str, Any]:
    """The Tuner's param space: what every trial shares (`ProfileSettings.to_config`), as
    the search `saved` (None: a new search) laid it out: Tune restores an experiment only
    with its param space's keys, and a search saved before the settings were one dict
    spelled each at the top of its trials' configs (the trial reads both); one saved with
    fewer settings in the dict restores with those (a setting left out takes its default)."""
    if saved is None:
        return settings.to_config()
    record = saved.resume_record
    if record.get(SETTINGS_LAYOUT_KEY) != PROFILE_SETTINGS_KEY:
        return settings.to_config(flat=True)
    return settings.to_config(names=record.get(SETTINGS_NAMES_KEY, FIRST_NESTED_KEYS))


def recorded_bounds(record: dict[str, Any]) -> SearchBounds:
    """The bounds (space, probe, device bytes) of a saved search's `resume_record`: no memory
    probe runs again."""
    space = SearchSpace(tuple(record["space"][0]), tuple(record["space"][1]))
    limit = record.get("batch_limit")  # absent from a search saved before it was kept
    probe = MemoryProbe(MemoryParams.from_dict(record["memory"]), record["memory_probe"],
                        max_local_batch=record["max_local_batch"],
                        batch_limit=None if limit is None else BatchLimit.from_dict(limit))
    return SearchBounds(space, probe, float(record["device_memory_bytes"]))


def run_experiment(searcher: TulaSearcher, param_space: dict[str, Any],
                   storage_path: str | None, name: str, resume: bool,
                   verbose: int) -> tuple[TulaSearcher, str]:
    """Run (or, with `resume` and a saved experiment, continue) the profiling trials, with
    `param_space` what every trial shares (`trial_param_space`). Returns the searcher's
    final state and the experiment's path.

    verbose (`tula_ray.verbosity`): Tune's boxes at 2, else tula-ray's progress lines
    (`SearchProgress`). A restored experiment keeps the output it was started with (Tune
    restores its run config, callbacks included)."""
    path = experiment_path(storage_path, name)
    level = ray_log_level(verbose)  # Ray Train's controller and workers (2: INFO)
    restored = resume and tune.Tuner.can_restore(path)
    if restored:
        logger.info("resuming the search saved at %s", path)
        # An interrupted trial is not rerun as it was: the searcher queues the batches it
        # had not finished (TulaSearcher.set_state), so no finished (N, B) runs twice.
        tuner = tune.Tuner.restore(path, trainable=trainable_with_resources(level),
                                   resume_unfinished=False, resume_errored=False,
                                   param_space=param_space)
    else:
        tuner = tune.Tuner(
            trainable_with_resources(level),
            param_space=param_space,
            # One trial at a time: the searcher suggests nothing while one runs. Not Tune's
            # max_concurrent_trials: its ConcurrencyLimiter saves the running trial with the
            # experiment and, restored, waits for that trial to end, which a trial
            # interrupted by a dead driver never does.
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1,
                                        metric=METRIC, mode=MODE,
                                        trial_name_creator=trial_name,
                                        trial_dirname_creator=trial_name),
            run_config=tune.RunConfig(storage_path=storage_path, name=name,
                                      verbose=tune_verbosity(verbose),
                                      callbacks=[SearchProgress(searcher, verbose)]),
        )
    with _tune_output(verbose):
        results = tuner.fit()
    if not restored:
        return searcher, results.experiment_path
    # A restored Tuner drives its own copy of the searcher, not `searcher`; Tune saves
    # that copy with the experiment at its end: read its final state there.
    return saved_search(results.experiment_path) or searcher, results.experiment_path


@contextlib.contextmanager
def _tune_output(verbose: int) -> Iterator[None]:
    """Below verbose 2, Tune's former output engine for the experiment (silent at Tune's
    verbose 0: tula-ray's own lines replace it); its new one, with its boxes, at 2. The
    variable is read when the experiment starts, and restored after it."""
    if tune_verbosity(verbose) > 0:
        yield
        return
    saved = os.environ.get(TUNE_NEW_OUTPUT_ENV)
    os.environ[TUNE_NEW_OUTPUT_ENV] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(TUNE_NEW_OUTPUT_ENV, None)
        else:
            os.environ[TUNE_NEW_OUTPUT_ENV] = saved


def trial_name(trial: Any) -> str:
    """A short trial name (and directory) from the searched keys only: Tune's default
    spells out the whole config, a user's Workload object included."""
    config = trial.config
    return f"profile_N{config.get('num_workers')}_round{config.get('round')}_{trial.trial_id}"
