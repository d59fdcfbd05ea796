"""What every profiling trial of a search shares (`ProfileSettings`): what it profiles, how
it measures, and where its worker group is placed; the search fixes it once, and the
trial and its worker loop read it typed. No Ray here (core module).

Tune needs a trial's config as plain values that its param space spells out, so the
search puts the settings there as one plain dict under PROFILE_SETTINGS_KEY
(`to_config`), beside the keys Tune searches over (num_workers, global_batches, round),
and the trial rebuilds them (`from_config`). A config that spells each setting at its top
(FLAT_KEYS: a search saved before the settings were one value, issue 42, step 3, or a
caller's own trial config) is read alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import torch

from tula_ray.training.strategy_base import TrainingStrategy
from tula_ray.workloads import Workload

WARMUP_STEPS_DEFAULT = 3
WARMUP_SECONDS_GPU = 0.5  # and at least this long on a GPU (`warmup_seconds_default`)
# At least this many timed steps per phase: only steps longer than MEASURE_SECONDS / 3
# run this few (a CPU's largest batches: on the demo a second each, 1-2 % apart); 5
# cost its profiling ~4 s of 66 (`python -m benchmarks profiling-wall`).
MEASURE_STEPS_DEFAULT = 3
# ... and more while a phase takes less than this: cheap for short steps, where the
# mean of a few steps is noisiest relative to the step (fixed costs, scheduler jitter).
MEASURE_SECONDS_DEFAULT = 1.0
SEED_DEFAULT = 0

# The trial config's key of the settings, one plain dict (`ProfileSettings.to_config`).
PROFILE_SETTINGS_KEY = "profile_settings"
# The settings a search's trial config spelled at its top before they were one value:
# what a search saved then restores with (Tune restores only with the same keys).
FLAT_KEYS = ("workload", "workload_options", "use_gpu", "warmup_steps", "measure_steps",
             "measure_seconds", "device_memory_bytes", "resources_per_worker",
             "workers_per_node", "provision_timeout_s", "epochs", "training_strategy",
             "training_options")
# The settings of a search saved with them as one dict before it recorded their names
# (SETTINGS_NAMES_KEY of its resume record, issue 45): restored, its trials' configs keep
# these keys (Tune restores an experiment only with the keys it was started with).
FIRST_NESTED_KEYS = FLAT_KEYS + ("warmup_seconds", "measure_memory", "seed")


@dataclass(frozen=True)
class ProfileSettings:
    """What every profiling trial of a search shares.

    What is profiled: the workload (a built-in's name, rebuilt with `workload_options`,
    or a Workload; None: none given, which the trial reports as the row's error), the
    epochs the plan predicts (None: the workload's), and the training strategy whose cost
    per step is measured (None: none) with its options.
    How: per batch, `warmup_steps` untimed steps lasting at least `warmup_seconds` (None:
    `warmup_seconds_default`), then per timed phase at least `measure_steps` steps, more
    while they fit in `measure_seconds`; a peak over `device_memory_bytes` (None: no
    limit) is out of memory; `measure_memory` False skips the CPU's MemTracker step;
    `seed` seeds the model and the data order.
    Where (the trial's, never the worker loop's): `use_gpu` (None: the cluster has GPUs),
    one worker's `resources_per_worker` (None: one device), `workers_per_node` (G: N <= G
    on one node; None: Ray's PACK), and `provision_timeout_s` (None: the trial's own
    wait) for a lost node to come back.
    Where `train` keeps its checkpoints: `storage_path` (a local path or a URI; the
    search's, else Ray's default), where the profiled checkpoint is uploaded and timed
    with its write (None: the local write alone; `tula_ray.training.epoch_costs`).
    """

    workload: str | Workload | None = None
    workload_options: dict[str, Any] | None = None
    epochs: int | None = None
    training_strategy: str | TrainingStrategy | None = None
    training_options: dict[str, Any] = field(default_factory=dict)
    warmup_steps: int = WARMUP_STEPS_DEFAULT
    warmup_seconds: float | None = None
    measure_steps: int = MEASURE_STEPS_DEFAULT
    measure_seconds: float = MEASURE_SECONDS_DEFAULT
    device_memory_bytes: float | None = None
    measure_memory: bool = True
    seed: int = SEED_DEFAULT
    use_gpu: bool | None = None
    resources_per_worker: dict[str, float] | None = None
    workers_per_node: int | None = None
    provision_timeout_s: float | None = None
    storage_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, as it is (a Workload stays an object: not `asdict`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_config(self, *, flat: bool = False,
                  names: Sequence[str] | None = None) -> dict[str, Any]:
        """The trial config's part that holds the settings: one plain dict under
        PROFILE_SETTINGS_KEY, of every setting or of `names` only (those of the saved
        search a restored one continues); `flat`: FLAT_KEYS at the top, as a search saved
        before the settings were one value restores with."""
        values = self.to_dict()
        if flat:
            return {key: values[key] for key in FLAT_KEYS}
        return {PROFILE_SETTINGS_KEY: {key: values[key] for key in names or values}}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ProfileSettings":
        """The settings of a trial config: its PROFILE_SETTINGS_KEY dict, else the
        settings spelled at its top (the other keys ignored); a missing one's default."""
        values = config.get(PROFILE_SETTINGS_KEY)
        if isinstance(values, ProfileSettings):  # a caller's own, already typed
            return values
        if values is None:
            values = config
        names = {f.name for f in fields(cls)}
        given = {key: value for key, value in values.items() if key in names}
        for key, kind in (("warmup_steps", int), ("measure_steps", int), ("seed", int),
                          ("measure_seconds", float), ("warmup_seconds", float),
                          ("device_memory_bytes", float)):
            if given.get(key) is not None:
                given[key] = kind(given[key])
        given["training_options"] = dict(given.get("training_options") or {})
        return cls(**given)


def warmup_seconds_default(device: torch.device) -> float:
    """Warm-up time per batch: a GPU's clocks and cuDNN's autotuning need a fraction of a
    second; on CPU the few warm-up steps are enough."""
    return WARMUP_SECONDS_GPU if device.type == "cuda" else 0.0
