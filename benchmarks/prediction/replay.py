"""Search strategies off the cluster: a strategy proposes, the measurements come from a
table instead of worker groups, the product's planner (`build_plan`) chooses, and the
choice is judged on a true table against the oracle's (`policy.choose` on that table).

Shared by the prediction benchmark (each strategy replayed on the measurements of a
recorded full search: `replay`) and the strategy simulation (synthetic measurements fed
to the search strategy in the Tune adapter's rounds): both plan over a candidate grid
with the product's `PlanContext` (`planned`) and judge with `regret`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from tula_ray.planning.context import PlanContext
    from tula_ray.planning.plan import Plan
    from tula_ray.planning.policy import Choice
    from tula_ray.space import Candidate, SearchSpace

STRATEGIES = ("full", "partial", "adaptive")  # the search strategies compared side by side
OBJECTIVES = ("time", "cost", "knee")  # the objectives each strategy's choice is judged for
KEY = ["num_workers", "global_batch"]  # a candidate's row in a table


def recorded_search(plan: Plan) -> tuple[SearchSpace, PlanContext]:
    """The grid (every N and B of its table) and the context a recorded search planned
    with: the context the plan records (meta["plan_context"]), or, for a plan from before
    it did (issue 42), its E and D, memory bound and model, collective and workload, the
    rest at the context's defaults."""
    from tula_ray.planning.context import PlanContext
    from tula_ray.space import SearchSpace

    table = plan.table
    space = SearchSpace.of_pairs(table["num_workers"], table["global_batch"])
    if "plan_context" in plan.meta:
        return space, PlanContext.from_dict(plan.meta["plan_context"])
    return space, PlanContext(epochs=plan.epochs, dataset_size=plan.dataset_size,
                              max_local_batch=plan.meta.get("max_local_batch"),
                              collective=plan.perf.collective, memory=plan.memory,
                              workload=plan.workload)


def grid(space: SearchSpace, context: PlanContext) -> list[Candidate]:
    """The candidates a search profiles: those within the context's memory bound."""
    max_local = context.max_local_batch or np.inf
    return [c for c in space.candidates() if c.local_batch <= max_local]


def strategy_options(strategy: str, context: PlanContext) -> dict[str, Any]:
    """`strategy`'s options as `search()` gives them: the cluster's G for a strategy that
    takes it, the context for a strategy that plans as it goes."""
    from tula_ray.planning.search_strategies import topology_options, with_plan_context

    options = topology_options(strategy, {}, context.workers_per_node)
    return with_plan_context(strategy, options, context)


def planned(space: SearchSpace, context: PlanContext, rows: pd.DataFrame,
            strategy: str) -> Plan:
    """The plan a `strategy` search that measured `rows` makes with this context, through
    `build_plan` (the product's path)."""
    from tula_ray.planning.plan import build_plan

    return build_plan(space, rows, context, search_strategy=strategy)


def replay(space: SearchSpace, context: PlanContext, profiles: pd.DataFrame,
           strategy: str) -> tuple[Plan, pd.DataFrame, int, str]:
    """Run `strategy`'s rounds against recorded measurements (`profiles`: a row for every
    candidate of the grid): it proposes, the recorded row for each proposed candidate is
    handed back (with that round's number), until it is done; it plans with `context`
    (its objective and pricing among it). Returns (its plan, the rows it measured, its
    rounds, why it stopped)."""
    from tula_ray.profile_table import profile_frame
    from tula_ray.planning.search_strategies import make_search_strategy

    chooser = make_search_strategy(strategy, strategy_options(strategy, context))
    profiles = profile_frame(profiles.to_dict("records"))  # every column
    measured = profiles.set_index(KEY)
    candidates = grid(space, context)
    rows = profiles.iloc[0:0].copy()
    for round_ in range(1, 100):
        proposal = chooser.propose(candidates, rows)
        if proposal.done:
            break
        picked = measured.loc[[(c.num_workers, c.global_batch) for c in proposal.candidates]]
        rows = pd.concat([rows, picked.reset_index().assign(round=round_)], ignore_index=True)
    return planned(space, context, rows, strategy), rows, round_ - 1, proposal.reason


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
