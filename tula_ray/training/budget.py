"""How long a run trains (issue 25, item 3): a number of epochs, or AdaScale's
scale-invariant budget (Johnson et al. 2020, "AdaScale SGD"), the epochs at the reference
batch M0 counted in the progress the run makes.

A strategy with a gain (AGS-NS: AdaScale's gain ratio r_t, 1 <= r_t <= B / M0) adds r_t
reference-batch steps per step: where the small batch's gradient is mostly noise, a step
at B averages it away and moves as far as B / M0 small steps; where it is mostly signal,
as far as one. The run stops once its
progress reaches the E0 epochs at M0 it stands for, E0 x D / M0 reference steps: between
E0 and E0 x B / M0 epochs at B. A strategy without a gain trains its epochs.

No Ray here (core module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BUDGETS = ("epochs", "scale-invariant")


@dataclass(frozen=True)
class Budget:
    """The training's length: `epochs` (E0), and for "scale-invariant" the reference batch
    M0 and the training set's size D that turn E0 into reference steps."""

    kind: str = "epochs"
    epochs: int = 1
    reference_batch: int = 32
    dataset_size: int = 1

    def __post_init__(self) -> None:
        if self.kind not in BUDGETS:
            raise ValueError(f"budget={self.kind!r} is unknown; use one of {BUDGETS}")

    @property
    def scale_invariant(self) -> bool:
        return self.kind == "scale-invariant"

    @property
    def target_progress(self) -> float:
        """E0 x D / M0: the reference-batch steps of E0 epochs at M0."""
        return self.epochs * self.dataset_size / self.reference_batch

    def max_epochs(self, global_batch: int) -> int:
        """The most epochs the budget can take at B: every gain 1 (all signal), each step
        then counting as one reference step, E0 x B / M0 epochs (at least E0)."""
        if not self.scale_invariant:
            return self.epochs
        return max(self.epochs, math.ceil(self.epochs * global_batch / self.reference_batch))

    def epochs_done(self, progress: float) -> float:
        """Progress in epochs at the reference batch: what E0 counts (ASHA's time)."""
        return progress * self.reference_batch / self.dataset_size

    def reached(self, progress: float | None) -> bool:
        """Whether a scale-invariant run's progress has reached its target (never, for a
        run without a gain: it trains its epochs)."""
        return (self.scale_invariant and progress is not None
                and progress >= self.target_progress * (1 - 1e-9))


def budget_for(kind: str, epochs: int, progress: tuple[float, int] | None,
               dataset_size: int) -> tuple[Budget, str | None]:
    """The budget of a run of `epochs` (E0) over `dataset_size` samples, for a strategy whose
    `progress()` is `progress` ((steps, reference batch), or None: no gain). A
    scale-invariant budget asked of a strategy without a gain falls back to its epochs,
    and the note says so."""
    if kind not in BUDGETS:
        raise ValueError(f"budget={kind!r} is unknown; use one of {BUDGETS}")
    if kind == "scale-invariant" and progress is None:
        return Budget("epochs", epochs), (
            f"budget 'scale-invariant': this strategy has no gain (AdaScale's progress is "
            f"AGS-NS's), so it trains its {epochs} epochs")
    reference = progress[1] if progress is not None else 1
    return Budget(kind, epochs, reference, dataset_size), None
