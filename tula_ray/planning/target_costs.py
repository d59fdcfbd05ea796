"""What a run to a target evaluates, priced (issue 43, item 1: the evaluation's cost is
part of the plan's time to accuracy; DESIGN "What the plan predicts").

A run of fixed epochs scores the test set after every epoch, and the plan's
`total_time_s` counts that pass. `train(target_accuracy=)` does not: it scores a
validation split every `evaluation_interval` steps (about a quarter epoch, with train's
defaults: `tula_ray.evaluation_schedule`) and the test set once, at the end. At the
demo's sizes (60k training images, a 10 % split, 10k test images) that is about 27k
samples evaluated per 60k trained instead of 10k. The plan has one evaluation pass
measured, over the test set (`eval_time_s`, `eval_samples` samples); a validation pass is
priced from it by the samples the two read (its fixed cost, an all-reduce, scaled too:
milliseconds, `benchmarks eval-probe`). Core module: no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tula_ray.evaluation_schedule import (VALIDATION_FRACTION_DEFAULT, evaluation_interval,
                                          held_out_size)


@dataclass(frozen=True)
class TargetEvaluations:
    """How `train(plan, target_accuracy=)`, with its defaults, evaluates a run of a
    training set of `dataset_size` samples (D, before any split): a validation pass of
    `validation_size` samples every interval, held out of D unless the workload has its
    own split (`held_out`), and the test set's `test_size` samples once."""

    dataset_size: int
    validation_size: int
    test_size: int
    held_out: bool = True

    @classmethod
    def from_profiles(cls, profiles: pd.DataFrame, dataset_size: int
                      ) -> "TargetEvaluations | None":
        """From the samples the profiled pass read (`eval_samples`) and the workload's own
        split's (`validation_samples`); None where no pass was measured with its samples
        (no test set, or profiles recorded before 2026-11-29: the plan then counts a test
        pass per epoch, as before)."""
        if "eval_samples" not in profiles or profiles["eval_samples"].isna().all():
            return None
        own = profiles["validation_samples"].dropna() if "validation_samples" in profiles \
            else pd.Series(dtype=float)
        validation = int(own.iloc[0]) if len(own) else held_out_size(
            dataset_size, VALIDATION_FRACTION_DEFAULT)
        return cls(int(dataset_size), validation, int(profiles["eval_samples"].dropna().iloc[0]),
                   held_out=not len(own))

    @property
    def train_size(self) -> int:
        """The samples an epoch of the run to a target trains on."""
        return self.dataset_size - self.validation_size if self.held_out else self.dataset_size

    def passes_per_epoch(self, global_batch: np.ndarray) -> np.ndarray:
        """Validation passes per `dataset_size` samples trained (the plan's epoch) at each
        global batch: one every `evaluation_interval` steps of the run's own epochs."""
        batches = np.asarray(global_batch, dtype=float)
        steps = np.floor(self.train_size / batches).astype(int)
        every = np.array([evaluation_interval(None, int(b), int(s))
                          for b, s in zip(batches.ravel(), steps.ravel())], dtype=float)
        return self.dataset_size / (every.reshape(batches.shape) * batches)

    def validation_s(self, test_pass_s: np.ndarray, global_batch: np.ndarray) -> np.ndarray:
        """The validation passes' seconds per plan epoch at each global batch, each pass
        priced from the test pass (`test_pass_s`) by the samples the two read."""
        return (self.passes_per_epoch(global_batch) * np.asarray(test_pass_s, dtype=float)
                * (self.validation_size / self.test_size))

    def per_run_epoch(self, per_plan_epoch: np.ndarray) -> np.ndarray:
        """Seconds per plan epoch (`dataset_size` samples trained) as seconds per epoch of
        the run (`train_size` samples)."""
        return np.asarray(per_plan_epoch, dtype=float) * (self.train_size / self.dataset_size)

    def epoch_extras_s(self, frame: pd.DataFrame) -> np.ndarray:
        """Per plan epoch, what the run to a target pays beyond its steps at each row of
        `frame` (its `eval_time_s`, `checkpoint_time_s`): its validation passes, and a
        checkpoint per epoch of its own (`train_size` samples)."""
        return (self.validation_s(frame["eval_time_s"].to_numpy(float),
                                  frame["global_batch"].to_numpy(float))
                + frame["checkpoint_time_s"].to_numpy(float) * (
                    self.dataset_size / self.train_size))

    def describe(self) -> str:
        """The pricing in words, for the plan's summary."""
        return (f"a run to a target (train's defaults): a {self.validation_size}-sample "
                "validation pass every quarter epoch, priced from the test pass by its "
                f"samples, and the {self.test_size}-sample test pass once")


def add_target_extras(frame: pd.DataFrame, evaluations: TargetEvaluations | None) -> None:
    """Adds `target_extra_s` (`TargetEvaluations.epoch_extras_s`) to `frame`; none when
    `evaluations` is None."""
    if evaluations is not None:
        frame["target_extra_s"] = evaluations.epoch_extras_s(frame)


def per_epoch_to_target(frame: pd.DataFrame, per_epoch: pd.Series | np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per plan epoch, seconds once) of a run to a target at each row of `frame`,
    from `per_epoch` (an epoch of fixed training: its steps, a test pass and a
    checkpoint): the test pass and checkpoint traded for the row's `target_extra_s`, and
    the test pass once. Without `target_extra_s`, `per_epoch` and nothing."""
    per_epoch = np.asarray(per_epoch, dtype=float)
    if "target_extra_s" not in frame:
        return per_epoch, np.zeros(len(frame))
    test_pass = frame["eval_time_s"].to_numpy(float)
    epoch = (per_epoch - test_pass - frame["checkpoint_time_s"].to_numpy(float)
             + frame["target_extra_s"].to_numpy(float))
    return epoch, test_pass
