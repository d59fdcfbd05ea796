"""The adaptive global batch's decisions (issue 44, item 1): at every evaluation interval,
the global batch B at the plan's N with the most goodput under the noise scale measured
so far, switched to only when it predicts a gain of `min_gain` or more (hysteresis).

The controller knows each allowed B's predicted step time at N (the plan's fitted
models: `BatchOption`), with the micro-batches a memory bound asks (a B / N over it
accumulates gradients, as Pollux does). It is pure arithmetic on numbers every rank
already shares: rank 0's decision is broadcast (`AdaptiveBatch.decide` takes the phi
rank 0 read, `tula_ray.distributed.broadcast_object`), and every decision is kept in
`schedule` with the phi and goodputs that explain it. Its state (the schedule) goes into
the checkpoint, so a resumed run continues the same schedule. No Ray here (core module).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from tula_ray.models.goodput import (SWITCH_GAIN_DEFAULT, accumulation_steps, best_batch,
                                     goodput, switched_batch)


@dataclass(frozen=True)
class BatchOption:
    """One global batch the run may train: its predicted step time at the plan's N (all
    its micro-batches and one synchronisation) and how many micro-batches a step takes."""

    global_batch: int
    step_time_s: float
    accumulation: int = 1

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.step_time_s


def batch_options(step_times_s: dict[int, float], num_workers: int,
                  max_local_batch: int | None = None) -> list[BatchOption]:
    """`BatchOption`s from each allowed B's predicted step time at N (at its accumulation:
    a B whose local batch exceeds `max_local_batch` takes `accumulation_steps`
    micro-batches)."""
    return [BatchOption(int(batch), float(seconds),
                        accumulation_steps(int(batch), num_workers, max_local_batch))
            for batch, seconds in sorted(step_times_s.items())]


@dataclass
class AdaptiveBatch:
    """Chooses B at each evaluation interval (see the module's docstring).

    options: the batches allowed (the plan's candidates at its N, smallest first).
    reference_batch: M0, the batch whose samples E(B) counts in.
    start: the batch of the first steps (before any phi is measured: goodput is unknown).
    min_gain: the relative goodput gain a switch needs (default 5 %).
    """

    options: Sequence[BatchOption]
    reference_batch: int
    start: int
    min_gain: float = SWITCH_GAIN_DEFAULT
    schedule: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.options = tuple(sorted(self.options, key=lambda option: option.global_batch))
        batches = [option.global_batch for option in self.options]
        if not batches:
            raise ValueError("an adaptive batch needs at least one allowed global batch")
        if self.start not in batches:
            raise ValueError(f"start={self.start} is not among the allowed batches {batches}")

    @property
    def current(self) -> BatchOption:
        """The batch trained now: the last decision's, else the start."""
        batch = self.schedule[-1]["global_batch"] if self.schedule else self.start
        return self.option(batch)

    def option(self, global_batch: int) -> BatchOption:
        for option in self.options:
            if option.global_batch == global_batch:
                return option
        raise ValueError(f"global_batch={global_batch} is not among the allowed batches "
                         f"{[option.global_batch for option in self.options]}")

    def goodputs(self, noise_scale: float) -> dict[int, float]:
        """Every allowed B's goodput under `noise_scale` (NaN: phi not measured yet)."""
        return {option.global_batch: goodput(option.samples_per_s, noise_scale,
                                             option.global_batch, self.reference_batch)
                for option in self.options}

    def decide(self, noise_scale: float, *, step: int, samples: int) -> BatchOption:
        """The batch for the steps from `step` on (after `samples` trained), recorded in
        `schedule` with the phi and goodputs that chose it. An unknown phi keeps B."""
        before = self.current
        if math.isnan(noise_scale):
            chosen, goodputs = before.global_batch, {}
            reason = "noise scale not measured yet: B kept"
        else:
            goodputs = self.goodputs(noise_scale)
            chosen = switched_batch(before.global_batch, goodputs, self.min_gain)
            reason = self._reason(before.global_batch, chosen, goodputs)
        option = self.option(chosen)
        self.schedule.append({"step": step, "samples": samples, "global_batch": chosen,
                              "accumulation": option.accumulation,
                              "noise_scale": noise_scale, "switched": chosen != before.global_batch,
                              "goodput": goodputs.get(chosen, math.nan),
                              "goodputs": {str(b): g for b, g in goodputs.items()},
                              "reason": reason})
        return option

    def _reason(self, before: int, chosen: int, goodputs: dict[int, float]) -> str:
        best = best_batch(goodputs)
        gain = goodputs[best] / goodputs[before] - 1.0 if goodputs[before] > 0 else math.inf
        if chosen != before:
            return (f"B {before} -> {chosen}: goodput {goodputs[chosen]:.4g} over "
                    f"{goodputs[before]:.4g} (+{gain:.1%} >= {self.min_gain:.0%})")
        if best == before:
            return f"B {before} has the most goodput"
        return (f"B {before} kept: B {best}'s goodput is only +{gain:.1%} "
                f"(< {self.min_gain:.0%})")

    def switches(self) -> list[dict[str, Any]]:
        """The decisions that changed B."""
        return [entry for entry in self.schedule if entry["switched"]]

    def state_dict(self) -> dict[str, Any]:
        """The schedule so far (a resumed run continues it), and the options it chose from."""
        return {"schedule": [dict(entry) for entry in self.schedule],
                "options": [asdict(option) for option in self.options],
                "start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = sorted(option["global_batch"] for option in state.get("options", ()))
        batches = [option.global_batch for option in self.options]
        if saved and saved != batches:
            raise ValueError(f"the checkpoint's adaptive batch chose among {saved}, this run "
                             f"among {batches}: resume with the same plan")
        self.schedule = [dict(entry) for entry in state["schedule"]]
