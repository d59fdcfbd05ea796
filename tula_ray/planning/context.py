"""The plan's context: everything a plan needs beyond the space and the rows (issue 42).

`PlanContext` is one frozen value, checked once when built: the training the plan
predicts, the objective and the pricing it chooses by, the memory bound and model, what
the training strategy refuses, the cluster's topology, the noise the accuracy objectives
use. `build_plan` takes it, `search()` builds it once after the memory probe, the
adaptive search plans its rounds with it (it travels to the Tune searcher as one JSON
object: `to_dict` / `from_dict`), and the plan records it (meta["plan_context"]).

Its defaults are the defaults of every entry point that plans (`search`, `build_plan`,
the adaptive search, the command line, the benchmarks' replay): they read them here.
Core module: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Any, Callable, Collection, Iterable, Mapping

from tula_ray.arguments import check_bool, check_choice, check_int, check_number, check_text
from tula_ray.models.memory import MemoryParams
from tula_ray.models.perf import COLLECTIVE_DEFAULT, COLLECTIVES, FORM_DEFAULT, FORMS
from tula_ray.models.pricing import Pricing, parse_pricing, pricing_to_dict
from tula_ray.planning.accuracy import (NOISE_CALIBRATION_DEFAULT, REFERENCE_BATCH_DEFAULT,
                                        check_noise_scale)
from tula_ray.planning.policy import WEIGHT_TIME_DEFAULT, check_objective, check_weight_time

OBJECTIVE_DEFAULT = "knee"  # paper §III-A3: the knee of training time vs B
PRICING_DEFAULT = "fixed"  # eq. 4b at the paper's price per node-hour (`FixedRate`)
WORKLOAD_NAME_DEFAULT = "custom"  # a plan's workload when its caller names none

Pair = tuple[int, int]  # (N, B)


def _positive_int(name: str) -> Callable[[Any], Any]:
    return lambda value: check_int(name, value, minimum=1, numpy=True)


def _optional_positive_int(name: str) -> Callable[[Any], Any]:
    return lambda value: check_int(name, value, minimum=1, optional=True, numpy=True)


# One check per plain value, each naming the value and what is allowed: PlanContext runs
# them when built, and `search()` before Ray starts (`check_plan_values`).
CHECKS: dict[str, Callable[[Any], Any]] = {
    "epochs": _positive_int("epochs"),
    "dataset_size": _positive_int("dataset_size"),
    "reference_batch": _positive_int("reference_batch"),
    "objective": check_objective,
    "weight_time": check_weight_time,
    # read when checked: a collective registered later is known from then on
    "collective": lambda value: check_choice("collective", value, sorted(COLLECTIVES)),
    "form": lambda value: check_choice("form", value, FORMS),
    "max_local_batch": _optional_positive_int("max_local_batch"),
    "max_workers": _optional_positive_int("max_workers"),
    "max_global_batch": _optional_positive_int("max_global_batch"),
    "workers_per_node": _optional_positive_int("workers_per_node"),
    "noise_scale": check_noise_scale,
    "noise_calibration": lambda value: check_number(
        "noise_calibration", value, low=0.0, low_open=True, high=math.inf, high_open=True,
        hint="the factor the profiles' noise scale is multiplied by"),
    "workload": lambda value: check_text("workload", value, hint="the workload's name"),
    "adaptive_batch": lambda value: check_bool(
        "adaptive_batch", value, hint="whether time_to_accuracy and cost_to_accuracy may "
        "choose an adaptive run (the plan's adaptive rows)"),
    "eval_at_local_batch": lambda value: check_bool(
        "eval_at_local_batch", value, hint="whether train evaluates at the training's local "
        "batch (a workload without eval_batch)"),
}


def check_plan_values(**values: Any) -> None:
    """The checks of the named values of a plan's context (`CHECKS`), for a caller that
    knows only some of them yet (`search()`, before the workload's size is known)."""
    for name, value in values.items():
        CHECKS[name](value)


@dataclass(frozen=True, kw_only=True)
class PlanContext:
    """What a plan needs beyond its space and its rows, checked when built.

    epochs: E of eq. 4a, the epochs the plan predicts; under an objective to an accuracy,
      the epochs that reach the target at `reference_batch`.
    dataset_size: D, the training samples of one epoch.
    objective, weight_time: what the choice minimises (`tula_ray.planning.policy`).
    pricing: a Pricing, or its name or dict (`tula_ray.models.pricing.parse_pricing`).
    collective, form: the sync and compute forms of the performance model (`perf.fit`).
    memory: the memory model (eq. 3); None: fitted from the profiles' own peaks.
    max_local_batch: the memory bound on b; max_workers, max_global_batch: the user's
      limits on N and B; None: no bound.
    workers_per_node: G, the workers one node holds: N > G spans nodes (its sync has a
      network level), partial search's corners include the largest N <= G, and every
      cost is in whole nodes (`tula_ray.models.pricing.billed_nodes`); None: one node
      holds every N, each worker billed as a node.
    reference_batch, noise_scale, noise_calibration: M0, at which `epochs` reach the
      target; each candidate's epochs to it scale with the profiled gradient noise times
      `noise_calibration` (`planning.accuracy`), or with the user's phi at the target
      (`tula_ray.measure_noise_scale` on a model trained to it; None: the profiles').
    untrainable: (N, B) -> why the training strategy cannot train it (marked `trainable`
      False, never chosen); a mapping or [N, B, why] triples, kept as ((N, B), why) pairs.
    plain_steps: the (N, B) where that strategy trains plain SGD steps: its measured cost
      per step is not added there (the table's `plain_steps`).
    workload: the workload's name, for the plan.
    adaptive_batch: whether `time_to_accuracy` and `cost_to_accuracy` may choose an
      adaptive run (a row of `Plan.adaptive`, `tula_ray.planning.adaptive_rows`), the batch
      following the noise scale inside N; the rows are predicted either way.
    eval_at_local_batch: whether `train` evaluates at the training's local batch (the
      workload has no `eval_batch`; a search sets it): each candidate's evaluation pass is
      then the profiled one priced at its b by the compute cost per sample (eq. 2b,
      `planning.estimates.evaluation_by_batch`). False: the profiled pass at every b (a
      context built by hand, or a plan from before this field).
    """

    epochs: int
    dataset_size: int
    objective: str = OBJECTIVE_DEFAULT
    pricing: Pricing | str | dict = PRICING_DEFAULT  # a Pricing once built
    weight_time: float = WEIGHT_TIME_DEFAULT
    collective: str = COLLECTIVE_DEFAULT
    form: str = FORM_DEFAULT
    memory: MemoryParams | None = None
    max_local_batch: int | None = None
    max_workers: int | None = None
    max_global_batch: int | None = None
    workers_per_node: int | None = None
    reference_batch: int = REFERENCE_BATCH_DEFAULT
    noise_scale: float | None = None
    noise_calibration: float = NOISE_CALIBRATION_DEFAULT
    untrainable: tuple[tuple[Pair, str], ...] = ()
    plain_steps: frozenset[Pair] = frozenset()
    workload: str = WORKLOAD_NAME_DEFAULT
    adaptive_batch: bool = True
    eval_at_local_batch: bool = False

    def __post_init__(self) -> None:
        check_plan_values(**{name: getattr(self, name) for name in CHECKS})
        normalised = {
            "pricing": parse_pricing(self.pricing),
            "memory": self.memory if self.memory is None or isinstance(self.memory, MemoryParams)
            else MemoryParams.from_dict(self.memory),
            "untrainable": _refusals(self.untrainable),
            "plain_steps": frozenset((int(n), int(b)) for n, b in self.plain_steps),
            # numpy's numbers as Python's, so that the context goes into JSON as it is
            **{name: None if getattr(self, name) is None else int(getattr(self, name))
               for name in ("epochs", "dataset_size", "reference_batch", "max_local_batch",
                            "max_workers", "max_global_batch", "workers_per_node")},
            **{name: None if getattr(self, name) is None else float(getattr(self, name))
               for name in ("weight_time", "noise_scale", "noise_calibration")},
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)

    @property
    def refused(self) -> dict[Pair, str]:
        """`untrainable` as a mapping (N, B) -> why."""
        return dict(self.untrainable)

    def to_dict(self) -> dict[str, Any]:
        """The context as JSON: the pricing and the memory model as their dicts, the
        refused candidates as [N, B, why], the plain-step ones as [N, B]."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "pricing": pricing_to_dict(self.pricing),
                "memory": None if self.memory is None else self.memory.to_dict(),
                "untrainable": [[n, b, why] for (n, b), why in self.untrainable],
                "plain_steps": [[n, b] for n, b in sorted(self.plain_steps)]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PlanContext":
        """The context `to_dict` wrote (or a dict of its keywords)."""
        return cls(**dict(data))


def _refusals(untrainable: Mapping[Pair, str] | Iterable[Collection]
              ) -> tuple[tuple[Pair, str], ...]:
    """(N, B) -> why, from a mapping, ((N, B), why) pairs or [N, B, why] triples."""
    items = untrainable.items() if isinstance(untrainable, Mapping) else untrainable
    pairs = {}
    for item in items:
        (n, b), why = (item[:2], item[2]) if len(item) == 3 else item
        pairs[int(n), int(b)] = str(why)
    return tuple(sorted(pairs.items()))


def context_defaults() -> dict[str, Any]:
    """Each defaulted field's default: what every entry point that plans defaults to."""
    return {f.name: f.default for f in fields(PlanContext) if f.default is not MISSING}
