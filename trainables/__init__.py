"""Ray-facing trainables of tula-ray.

- `profiling_trial`: the Tune trainable that profiles one cluster size, several batches,
  with one Ray Train job;
- `profiling_loop`: that job's per-worker loop, over the Ray-free measuring of
  `tula_ray.training.profile_sweep`;
- `training_loop`: the per-worker loop of `tula_ray.train`;
- `memory_probe`: the memory probe and the bound check, as Ray tasks on one worker.
"""

from trainables.profiling_loop import profile_loop_per_worker
from trainables.profiling_trial import (build_trainer, profile_cluster_size,
                                        trainable_with_resources)

__all__ = ["build_trainer", "profile_cluster_size", "profile_loop_per_worker",
           "trainable_with_resources"]
