"""The adaptive global batch applied to a training run (issue 44, item 1): every
`every_samples` samples, the online noise scale is read on every rank, rank 0's
`AdaptiveBatch` decides, the decision is broadcast, and from the next step the data path
serves the new local batch (`Batches.resize`), the strategy's LR follows it
(`StrategySetup.set_global_batch`: AdaScale's gain for AGS-NS, the linear rule for lrs
and lars, unchanged for lbt) in as many micro-batches as the memory bound asks, and the
noise scale and the target's counts use the new B. No Ray here (core module).
"""

from __future__ import annotations

from typing import Any

from tula_ray.distributed import broadcast_from_rank0
from tula_ray.training.batch_controller import AdaptiveBatch, BatchOption
from tula_ray.training.batches import Batches
from tula_ray.training.online_noise import OnlineNoise
from tula_ray.training.strategy_base import StrategySetup
from tula_ray.training.target import TargetTracker, interval_due


class BatchAdapter:
    """One process's side of an adaptive batch: counts the samples trained, and at each
    interval takes rank 0's decision and applies it (see the module's docstring)."""

    def __init__(self, controller: AdaptiveBatch, *, every_samples: int, num_replicas: int,
                 rank: int, loader: Batches, setup: StrategySetup,
                 noise: OnlineNoise | None, tracker: TargetTracker | None) -> None:
        self.controller, self.every_samples = controller, int(every_samples)
        self.num_replicas, self.rank = num_replicas, rank
        self.loader, self.setup, self.noise, self.tracker = loader, setup, noise, tracker
        self.steps = self.samples = 0
        self.global_batch = controller.start  # the B the setup and loader are at

    def start(self, built_at: int) -> None:
        """Moves a run built at `built_at` to the controller's current batch (the start, or
        a resumed schedule's last). Before any state is loaded into the setup."""
        self.global_batch = built_at
        self._apply(self.controller.current)

    def after_step(self) -> None:
        """Counts a step at the current B; at an interval, decides and applies."""
        before = self.samples
        self.steps, self.samples = self.steps + 1, self.samples + self.global_batch
        if not interval_due(before, self.samples, self.every_samples):
            return
        phi = float("nan") if self.noise is None else self.noise.read()["noise_scale"]
        entry = None
        if self.rank == 0:
            self.controller.decide(phi, step=self.steps, samples=self.samples)
            entry = self.controller.schedule[-1]
        entry = broadcast_from_rank0(entry)
        if self.rank != 0:
            self.controller.schedule.append(entry)
        self._apply(self.controller.option(entry["global_batch"]))

    def _apply(self, option: BatchOption) -> None:
        local = option.global_batch // self.num_replicas
        self.setup.set_global_batch(self.global_batch, option.global_batch,
                                    option.accumulation)
        self.loader.resize(local)
        if self.noise is not None:
            self.noise.local_batch = local
        if self.tracker is not None:
            self.tracker.global_batch = option.global_batch
        self.global_batch = option.global_batch

    def state_dict(self) -> dict[str, Any]:
        """The schedule, and the steps and samples it counts (a resumed run continues)."""
        return {**self.controller.state_dict(), "steps": self.steps, "samples": self.samples}

    def resume(self, state: dict[str, Any]) -> None:
        """A checkpoint's schedule, its last batch applied: before the checkpoint's
        optimizer and scheduler are loaded (which hold the LR at that batch)."""
        self.controller.load_state_dict(state)
        self.steps, self.samples = int(state["steps"]), int(state["samples"])
        self._apply(self.controller.current)
