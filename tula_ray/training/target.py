"""Training to an accuracy (issue 43, item 1): the validation split is scored at fixed
intervals of samples, and the run stops at the first evaluation that reaches the target.

`Target` is what the user asked for (the accuracy, how often to look); `TargetTracker`
follows one run: it counts the steps and samples every rank trains, evaluates the
validation split when an interval is due, keeps every evaluation, and says when to stop.
Its state goes into the checkpoint, so a resumed run keeps its counts, its clock and its
history. Every rank evaluates its share of the validation split and the sums are
all-reduced (`epochs.evaluate`): all ranks see the same accuracy and stop at the same
step. No Ray here (core module).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tula_ray.arguments import check_int, check_number
# What `TargetTracker.summary` reports, in order.
TARGET_SUMMARY = ("target_accuracy", "target_reached", "time_to_target_s", "samples_to_target",
                  "steps_to_target", "evaluations")


@dataclass(frozen=True)
class Target:
    """Train until the validation accuracy reaches `accuracy`, evaluating every
    `every_steps` optimizer steps (whole steps: `eval_every_samples` rounded)."""

    accuracy: float
    every_steps: int

    def reached(self, accuracy: float) -> bool:
        return accuracy >= self.accuracy


def check_target(target_accuracy: float | None, eval_every_samples: int | None,
                 adaptive: bool = False) -> None:
    """The target's arguments, before anything is built: an accuracy in (0, 1], an
    interval of at least one sample, and no interval without a target (or an adaptive
    batch, which chooses B at the same intervals)."""
    check_number("target_accuracy", target_accuracy, low=0.0, high=1.0, low_open=True,
                 optional=True)
    check_int("eval_every_samples", eval_every_samples, minimum=1, optional=True,
              hint="training samples between two evaluations of the validation split")
    if eval_every_samples is not None and target_accuracy is None and not adaptive:
        raise ValueError(f"eval_every_samples={eval_every_samples} is only used with a "
                         "target_accuracy or an adaptive batch: give one, or leave "
                         "eval_every_samples out")


def interval_due(samples_before: int, samples_after: int, every_samples: int) -> bool:
    """Whether a step that took the sample count from `samples_before` to `samples_after`
    crossed a multiple of `every_samples` (an interval counted in samples: the same every
    step at a fixed B, and as often in samples when B changes)."""
    return samples_after // every_samples != samples_before // every_samples


@dataclass
class TargetTracker:
    """One run's way to its target: its steps, samples and wall clock so far (training
    and evaluation both, what `time_to_target_s` reports), every evaluation, and the one
    that reached the target.

    evaluate: scores the validation split, returning {"val_loss", "val_accuracy"} (the
    same on every rank). global_batch: the samples one step trains (all ranks together).
    """

    target: Target
    global_batch: int
    evaluate: Callable[[], dict[str, float]]
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0  # the run's wall until the last step or evaluation (resumes add)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    reached_at: dict[str, Any] | None = None
    epoch_eval_seconds: float = 0.0  # this epoch's evaluations (left out of its `seconds`)
    _clock: float | None = None

    def __post_init__(self) -> None:
        # The interval in samples, fixed at the first B: an adaptive batch changes
        # `global_batch` while training, and the evaluations stay as often in samples.
        self.every_samples = self.target.every_steps * self.global_batch

    def start(self) -> None:
        """Starts (or, after a resume, restarts) the run's clock: before its first step."""
        self._clock = time.perf_counter()

    def after_step(self, epoch: int) -> bool:
        """Counts a step of `epoch`; evaluates when an interval is due. True: stop here,
        the target is reached."""
        before = self.samples
        self.steps += 1
        self.samples += self.global_batch
        if not interval_due(before, self.samples, self.every_samples):
            return False
        started = time.perf_counter()
        scores = self.evaluate()
        self.epoch_eval_seconds += time.perf_counter() - started
        self._tick()
        row = {"epoch": epoch, "steps": self.steps, "samples": self.samples,
               "seconds": self.seconds, "global_batch": self.global_batch, **scores}
        self.evaluations.append(row)
        if self.target.reached(scores["val_accuracy"]):
            self.reached_at = row
            return True
        return False

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._clock is not None:
            self.seconds += now - self._clock
        self._clock = now

    def take_epoch_eval_seconds(self) -> float:
        """This epoch's evaluation seconds, and a fresh count for the next epoch."""
        seconds, self.epoch_eval_seconds = self.epoch_eval_seconds, 0.0
        return seconds

    def latest(self) -> dict[str, float]:
        """The last evaluation's val_loss and val_accuracy (NaN before the first)."""
        last = self.evaluations[-1] if self.evaluations else {}
        return {key: last.get(key, math.nan) for key in ("val_loss", "val_accuracy")}

    def summary(self) -> dict[str, Any]:
        """What a run to a target reports: the target, whether it was reached, and when
        (time_to_target_s, samples_to_target, steps_to_target; NaN when not reached)."""
        at = self.reached_at or {}
        return {"target_accuracy": self.target.accuracy, "target_reached": bool(at),
                "time_to_target_s": at.get("seconds", math.nan),
                "samples_to_target": at.get("samples", math.nan),
                "steps_to_target": at.get("steps", math.nan),
                "evaluations": len(self.evaluations)}

    def state_dict(self) -> dict[str, Any]:
        """What the checkpoint keeps (a resumed run continues its counts and history)."""
        self._tick()
        return {"steps": self.steps, "samples": self.samples, "seconds": self.seconds,
                "evaluations": list(self.evaluations), "reached_at": self.reached_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.samples = int(state["steps"]), int(state["samples"])
        self.seconds = float(state["seconds"])
        self.evaluations = list(state["evaluations"])
        self.reached_at = state.get("reached_at")
