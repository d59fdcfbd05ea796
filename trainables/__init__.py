"""Ray-facing trainables: the per-worker profiling loop and the Tune trainable around it."""

from trainables.loop import profile_loop_per_worker
from trainables.profile import (
    DRIVER_RESOURCE,
    build_trainer,
    profile_candidate,
    trainable_with_resources,
    trial_resources,
)

__all__ = ["DRIVER_RESOURCE", "build_trainer", "profile_candidate", "profile_loop_per_worker",
           "trainable_with_resources", "trial_resources"]
