"""Adaptive search (beyond the paper, issue 11): profile where the choice is least certain.

It plans as it goes (`build_plan` on the rows so far), so it sits above tula_ray.planning.plan,
which itself asks the registry of tula_ray.planning.search_strategies which rows to fit: a
strategy registered from its own module, as a user's would be.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

import pandas as pd

from tula_ray.arguments import check_int, check_number
from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import build_plan
from tula_ray.planning.policy import KNEE_OBJECTIVES
from tula_ray.planning.search_strategies import (PartialSearch, Proposal, candidate_key,
                                                 open_candidates, register_search_strategy)
from tula_ray.profile_table import usable
from tula_ray.space import Candidate, SearchSpace

ADAPTIVE_MAX_ROUNDS_DEFAULT = 4  # corners, then at most 3 rounds of contenders
# The plan's context as a search saved it before PlanContext (issue 42): keywords of the
# strategy's own, each a PlanContext field (workers_per_node is the corners' keyword too).
SAVED_CONTEXT = ("objective", "epochs", "dataset_size", "pricing", "weight_time", "collective",
                 "memory", "max_local_batch", "reference_batch", "noise_scale",
                 "untrainable", "plain_steps")
# The context of an adaptive search built without one (to say which rows a plan fits from):
# its defaults before PlanContext, one epoch of one sample.
CONTEXT_WITHOUT_SEARCH = {"epochs": 1, "dataset_size": 1}


def search_progress(rows: pd.DataFrame) -> dict[str, float]:
    """Rounds, worker-group launches and profiling seconds spent, from the rows' own
    records (`round`, `launch_wall_s`, `profile_wall_s`): no state outside the rows."""
    if rows.empty or rows["round"].isna().all():
        return {"rounds": 0, "launches": 0, "seconds": 0.0}
    launches = rows.dropna(subset=["round"]).groupby(["round", "num_workers"])
    seconds = float(launches["launch_wall_s"].max().fillna(0).sum()
                    + rows["profile_wall_s"].fillna(0).sum())
    return {"rounds": int(rows["round"].max()), "launches": launches.ngroups, "seconds": seconds}


class AdaptiveSearch:
    """Beyond the paper (issue 11, item 3): start from the partial corners, then in rounds
    profile the predicted choice and every unmeasured candidate that ties with it within
    the uncertainty (measured spread plus the fit's out-of-sample error: the plan's
    `Choice.ties`), refit, choose again. Done when the choice is measured and no
    unmeasured candidate ties it, or when a budget (rounds, launches, seconds) is spent.

    The plan's context (`PlanContext`: objective, pricing, epochs, dataset_size, ...) is
    an option too, `plan_context`, as JSON, so that the strategy, like the others, is
    rebuilt from JSON on restore; among it the training strategy's `untrainable` (never
    chosen) and `plain_steps` (no strategy cost), as the final plan has them. A search
    saved before (issue 42) holds the context as keywords of their own (`SAVED_CONTEXT`):
    they are taken as before. `middle` is partial search's: False starts from the paper's
    four corners alone; `workers_per_node` its corners' G, the context's where not given.
    """

    name = "adaptive"
    needs_plan_context = True  # search() passes the plan's context in as `plan_context`

    def __init__(self, *, max_rounds: int = ADAPTIVE_MAX_ROUNDS_DEFAULT,
                 max_launches: int | None = None, max_seconds: float | None = None,
                 plan_context: PlanContext | dict | None = None,
                 workers_per_node: int | None = None, middle: bool = True,
                 **saved_context: Any) -> None:
        for label, value in (("max_rounds", max_rounds), ("max_launches", max_launches)):
            check_int(label, value, minimum=1, optional=True)
        check_number("max_seconds", max_seconds, low=0.0, low_open=True, high=math.inf,
                     optional=True)
        self.max_rounds, self.max_launches, self.max_seconds = max_rounds, max_launches, max_seconds
        # the final plan's context, the training strategy's refusals among it, so that a
        # round never chases a choice that plan could not make
        self.context = _context(plan_context, saved_context, workers_per_node)
        # its first round is partial search's, middle batches included (middle=True)
        self._corners = PartialSearch(workers_per_node=self.context.workers_per_node,
                                      middle=middle)

    def fit_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        return usable(rows)

    def _budget_spent(self, rows: pd.DataFrame) -> str:
        done = search_progress(rows)
        if self.max_rounds is not None and done["rounds"] >= self.max_rounds:
            return f"{done['rounds']} rounds (max_rounds={self.max_rounds})"
        if self.max_launches is not None and done["launches"] >= self.max_launches:
            return f"{done['launches']} launches (max_launches={self.max_launches})"
        if self.max_seconds is not None and done["seconds"] >= self.max_seconds:
            return f"{done['seconds']:.0f} s of profiling (max_seconds={self.max_seconds:g})"
        return ""

    def propose(self, grid: Sequence[Candidate], rows: pd.DataFrame) -> Proposal:
        corners = self._corners.propose(grid, rows)
        if not corners.done:
            return Proposal(corners.candidates, "adaptive search, first round: " + corners.reason)
        space = SearchSpace.of_pairs([c.num_workers for c in grid],
                                     [c.global_batch for c in grid])
        plan = build_plan(space, rows, self.context, search_strategy=self.name)
        choice = plan.choice
        open_keys = {candidate_key(c) for c in open_candidates(grid, rows)}
        wanted = [(choice.num_workers, choice.global_batch), *choice.ties,
                  *_knee_neighbours(choice, grid, self.context.objective)]
        refused = self.context.refused  # never the plan's choice: not worth a launch
        todo = [Candidate(n, b) for n, b in dict.fromkeys(wanted)
                if (n, b) in open_keys and (n, b) not in refused]
        named = f"N={choice.num_workers}, B={choice.global_batch}"
        if not todo:
            why = (f"the choice {named} is measured and no unmeasured candidate ties it "
                   "within the uncertainty")
            if choice.ties:
                why += f" (measured ties: {choice.describe_ties()})"
            return Proposal((), "adaptive search: " + why)
        spent = self._budget_spent(rows)
        if spent:
            state = "measured" if (choice.num_workers, choice.global_batch) not in open_keys \
                else "predicted, not measured"
            return Proposal((), f"adaptive search: budget spent after {spent}; the choice "
                                f"{named} is {state}, {len(todo)} contenders left unmeasured")
        return Proposal(tuple(todo), f"adaptive search: the choice {named} and the "
                                     "unmeasured candidates that tie it within the uncertainty")


def _context(plan_context: PlanContext | dict | None, saved: dict[str, Any],
             workers_per_node: int | None) -> PlanContext:
    """The strategy's plan context: `plan_context`, or a saved search's keywords, or (built
    to say which rows to fit, or by a test) the former defaults, one epoch of one sample;
    with the corners' G where the context has none."""
    unknown = sorted(set(saved) - set(SAVED_CONTEXT))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    if plan_context is not None and saved:
        raise TypeError(f"plan_context and {sorted(saved)} both given: the context is one "
                        "of them")
    if isinstance(plan_context, PlanContext):
        context = plan_context
    else:
        context = PlanContext.from_dict(plan_context or {**CONTEXT_WITHOUT_SEARCH, **saved})
    if workers_per_node is None or context.workers_per_node == workers_per_node:
        return context
    if context.workers_per_node is not None:
        raise ValueError(f"workers_per_node={workers_per_node} differs from the plan "
                         f"context's {context.workers_per_node}: one cluster, one G")
    return replace(context, workers_per_node=workers_per_node)


def _knee_neighbours(choice, grid: Sequence[Candidate], objective: str) -> list[tuple[int, int]]:
    """For the knee, the next smaller and larger batch at the chosen N: a knee is a
    property of the curve's shape around it, which these measurements pin down."""
    if objective not in KNEE_OBJECTIVES:
        return []
    batches = sorted(c.global_batch for c in grid if c.num_workers == choice.num_workers)
    i = batches.index(choice.global_batch) if choice.global_batch in batches else -1
    if i < 0:
        return []
    return [(choice.num_workers, batches[j]) for j in (i - 1, i + 1) if 0 <= j < len(batches)]


register_search_strategy("adaptive", AdaptiveSearch)
