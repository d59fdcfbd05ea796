"""Search strategies off the cluster: a strategy proposes, the measurements come from a
table instead of worker groups, the product's planner (`build_plan`) chooses, and the
choice is judged on a true table against the oracle's (`policy.choose` on that table).

Shared by the prediction benchmark (each strategy replayed on the measurements of a
recorded full search: `replay`) and the strategy simulation (synthetic measurements fed
to the search strategy in the Tune adapter's rounds): both plan with a `SearchContext`
and judge with `regret`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from tula_ray.models.memory import MemoryParams
    from tula_ray.planning.plan import Plan
    from tula_ray.planning.policy import Choice
    from tula_ray.space import SearchSpace

STRATEGIES = ("full", "partial", "adaptive")  # the search strategies compared side by side
OBJECTIVES = ("time", "cost", "knee")  # the objectives each strategy's choice is judged for
KEY = ["num_workers", "global_batch"]  # a candidate's row in a table


@dataclass(frozen=True)
class SearchContext:
    """What a search plans with besides its rows: the candidate grid, the training it
    plans for (E epochs of D samples, eq. 4a), the memory bound and model, the collective
    and the workload's name; `build_plan`'s defaults where a benchmark has none."""

    space: SearchSpace
    epochs: int
    dataset_size: int
    max_local_batch: int | None = None  # the memory probe's bound; None: no bound
    collective: str = "ring"
    memory: MemoryParams | None = None
    workload: str = "custom"

    @classmethod
    def of_plan(cls, plan: Plan) -> SearchContext:
        """The context a recorded search planned with: its grid (every N and B of its
        table), its E and D, its memory bound and model, its collective and workload."""
        from tula_ray.space import SearchSpace

        table = plan.table
        space = SearchSpace.of_pairs(table["num_workers"], table["global_batch"])
        return cls(space, plan.epochs, plan.dataset_size, plan.meta.get("max_local_batch"),
                   plan.perf.collective, plan.memory, plan.workload)

    def grid(self) -> list:
        """The candidates a search profiles: those within the memory bound."""
        max_local = self.max_local_batch or np.inf
        return [c for c in self.space.candidates() if c.local_batch <= max_local]

    def strategy_options(self, strategy: str, objective: str, pricing) -> dict[str, Any]:
        """`strategy`'s options with this context, for a strategy that plans as it goes."""
        from tula_ray.models.pricing import pricing_to_dict
        from tula_ray.planning.search_strategies import with_plan_context

        return with_plan_context(
            strategy, {}, objective=objective, epochs=self.epochs,
            dataset_size=self.dataset_size, pricing=pricing_to_dict(pricing),
            collective=self.collective,
            memory=None if self.memory is None else self.memory.to_dict(),
            max_local_batch=self.max_local_batch)

    def plan(self, rows: pd.DataFrame, strategy: str, objective: str, pricing) -> Plan:
        """The plan a `strategy` search that measured `rows` makes, for this objective and
        pricing, through `build_plan` (the product's path)."""
        from tula_ray.planning.plan import build_plan

        return build_plan(self.space, rows, epochs=self.epochs, dataset_size=self.dataset_size,
                          strategy=strategy, objective=objective, pricing=pricing,
                          memory=self.memory, max_local_batch=self.max_local_batch,
                          collective=self.collective, workload=self.workload)


def replay(context: SearchContext, profiles: pd.DataFrame, strategy: str,
           objective: str = "knee", pricing=None) -> tuple[Plan, pd.DataFrame, int, str]:
    """Run `strategy`'s rounds against recorded measurements (`profiles`: a row for every
    candidate of the grid): it proposes, the recorded row for each proposed candidate is
    handed back (with that round's number), until it is done. Returns (its plan, the rows
    it measured, its rounds, why it stopped)."""
    from tula_ray.models.pricing import FixedRate
    from tula_ray.profile_table import profile_frame
    from tula_ray.planning.search_strategies import make_search_strategy

    pricing = pricing or FixedRate()
    chooser = make_search_strategy(strategy, context.strategy_options(strategy, objective, pricing))
    profiles = profile_frame(profiles.to_dict("records"))  # every column
    measured = profiles.set_index(KEY)
    grid = context.grid()
    rows = profiles.iloc[0:0].copy()
    for round_ in range(1, 100):
        proposal = chooser.propose(grid, rows)
        if proposal.done:
            break
        picked = measured.loc[[(c.num_workers, c.global_batch) for c in proposal.candidates]]
        rows = pd.concat([rows, picked.reset_index().assign(round=round_)], ignore_index=True)
    plan = context.plan(rows, strategy, objective, pricing)
    return plan, rows, round_ - 1, proposal.reason


def metric_of(objective: str) -> str:
    """The column a choice is judged on: the cost for the cost objective, the training
    time otherwise (time, knee)."""
    return "cost_usd" if objective == "cost" else "total_time_s"


def measured_at(truth: pd.DataFrame, choice: Choice, metric: str) -> float:
    """`metric` of `choice`'s row in `truth` (a table indexed by `KEY`)."""
    return float(truth.loc[(choice.num_workers, choice.global_batch), metric])


def regret(measured: float, best: float) -> float:
    """(the choice's measured metric - the oracle's) / the oracle's. Not negative for a
    minimised metric (time, cost); signed for the knee (a knee is not a minimum)."""
    return (measured - best) / best


def regret_on(truth: pd.DataFrame, choice: Choice, objective: str) -> float:
    """The regret of `choice` on the true table `truth` against `policy.choose` on it."""
    from tula_ray.planning.policy import choose

    metric = metric_of(objective)
    indexed = truth.set_index(KEY)
    best = measured_at(indexed, choose(truth, objective), metric)
    return regret(measured_at(indexed, choice, metric), best)
