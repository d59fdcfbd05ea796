"""Search strategies: which (N, B) candidates to profile next, and when the search is done.

One protocol, `SearchStrategy`, and a registry, `STRATEGIES`: full and partial search
(paper §III-A2) are registered here; a fourth strategy is one `register_strategy` call.
A strategy is a pure function of the grid and the rows measured so far: it keeps no
state of its own, so the Tune searcher that drives it (`searchers.TulaSearcher`, a thin
adapter, as Ray's `OptunaSearch` is over an Optuna sampler) saves and restores the
search as plain JSON rows. It also says which measured rows the performance model is
fitted from (`fit_rows`).

Round by round: the adapter asks `propose`, profiles what it names (one worker group
per cluster size N), records the rows, and asks again; an empty proposal ends the
search, and its `reason` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import pandas as pd

from tula_ray.profile_table import STATUS_OK, oom_local_batch, usable
from tula_ray.space import Candidate, corners


@dataclass(frozen=True)
class Proposal:
    """What to profile next; empty when the search is done, and why in either case."""

    candidates: tuple[Candidate, ...]
    reason: str

    @property
    def done(self) -> bool:
        return not self.candidates


class SearchStrategy(Protocol):
    """Decides what a search profiles. Implementations hold only their options."""

    name: str

    def propose(self, grid: Sequence[Candidate], rows: pd.DataFrame) -> Proposal:
        """The candidates to profile in the next round, given every row measured so far
        (a `profile_table.profile_frame`: ok, oom and error rows). Never a candidate
        that already has a row; an empty proposal ends the search."""
        ...

    def fit_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The measured rows the performance model is fitted from."""
        ...


def _key(candidate: Candidate) -> tuple[int, int]:
    return candidate.num_workers, candidate.global_batch


def measured_keys(rows: pd.DataFrame) -> set[tuple[int, int]]:
    """(N, B) of every row, whatever its status: a candidate is profiled at most once."""
    return set(zip(rows["num_workers"].astype(int), rows["global_batch"].astype(int)))


def open_candidates(grid: Sequence[Candidate], rows: pd.DataFrame) -> list[Candidate]:
    """Candidates with no row yet and a local batch below every out-of-memory one
    (memory per worker depends on b only: an OOM at b rules out b' >= b for every N)."""
    done, bound = measured_keys(rows), oom_local_batch(rows)
    return [c for c in grid if _key(c) not in done and c.local_batch < bound]


class FullSearch:
    """Every candidate of the grid (paper §III-A2, "full search")."""

    name = "full"

    def propose(self, grid: Sequence[Candidate], rows: pd.DataFrame) -> Proposal:
        todo = open_candidates(grid, rows)
        if todo:
            return Proposal(tuple(todo), f"full search: {len(todo)} candidates not yet profiled")
        return Proposal((), "full search: every feasible candidate is profiled")

    def fit_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        return usable(rows)


class PartialSearch:
    """The extremes: min/max N x min/max B (paper §III-A2, "partial search").

    A corner that ran out of memory or crashed is replaced by the next batch inward at
    the same N (paper §IV-B: "relaunching progressively smaller batches until a
    feasible configuration is found"), so that the model stays identified.
    """

    name = "partial"

    def propose(self, grid: Sequence[Candidate], rows: pd.DataFrame) -> Proposal:
        status = {(int(n), int(b)): s for n, b, s in
                  zip(rows["num_workers"], rows["global_batch"], rows["status"])}
        bound = oom_local_batch(rows)
        sizes = sorted({c.num_workers for c in grid})
        needed = []
        for n in sorted({sizes[0], sizes[-1]}):
            at_n = sorted((c for c in grid if c.num_workers == n), key=lambda c: c.global_batch)
            for side in (at_n, at_n[::-1]):  # the smallest batch, then the largest
                for candidate in side:
                    state = status.get(_key(candidate))
                    if state is None and candidate.local_batch < bound:
                        needed.append(candidate)
                        break
                    if state == STATUS_OK:
                        break  # this side is covered; failed or too large: try inward
        needed = list(dict.fromkeys(needed))
        if needed:
            return Proposal(tuple(needed), "partial search: the extremes of N and B "
                                           "(the next batch inward where one failed)")
        return Proposal((), "partial search: every extreme is profiled")

    def fit_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The usable rows at the corners of what was measured: min/max N x min/max B."""
        ok = usable(rows)
        if ok.empty:
            return ok
        pairs = [Candidate(int(n), int(b)) for n, b in zip(ok["num_workers"], ok["global_batch"])]
        keep = {_key(c) for c in corners(pairs)}
        picked = [(int(n), int(b)) in keep for n, b in zip(ok["num_workers"], ok["global_batch"])]
        return ok[picked].reset_index(drop=True)


ADAPTIVE_MAX_ROUNDS_DEFAULT = 4  # corners, then at most 3 rounds of contenders


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

    The plan context (objective, pricing, epochs, dataset_size, ...) are options too, so
    that the strategy, like the others, is rebuilt from JSON on restore.
    """

    name = "adaptive"
    needs_plan_context = True  # search() passes the plan's context in as options

    def __init__(self, *, max_rounds: int = ADAPTIVE_MAX_ROUNDS_DEFAULT,
                 max_launches: int | None = None, max_seconds: float | None = None,
                 objective: str = "knee", epochs: int = 1, dataset_size: int = 1,
                 pricing: Any = "fixed", weight_time: float = 0.5, collective: str = "ring",
                 memory: dict | None = None, max_local_batch: int | None = None) -> None:
        for label, value in (("max_rounds", max_rounds), ("max_launches", max_launches)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{label}={value!r}; it must be an integer >= 1 or None")
        if max_seconds is not None and not max_seconds > 0:
            raise ValueError(f"max_seconds={max_seconds!r}; it must be > 0 or None")
        self.max_rounds, self.max_launches, self.max_seconds = max_rounds, max_launches, max_seconds
        self.context = dict(objective=objective, epochs=epochs, dataset_size=dataset_size,
                            pricing=pricing, weight_time=weight_time, collective=collective,
                            max_local_batch=max_local_batch)
        self.memory = memory
        self._corners = PartialSearch()

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
        from tula_ray import memory as memory_model  # here: plan imports this module
        from tula_ray.plan import build_plan
        from tula_ray.space import SearchSpace

        space = SearchSpace(tuple(sorted({c.num_workers for c in grid})),
                            tuple(sorted({c.global_batch for c in grid})))
        memory = None if self.memory is None else memory_model.MemoryParams.from_dict(self.memory)
        plan = build_plan(space, rows, strategy=self.name, memory=memory, **self.context)
        choice = plan.choice
        open_keys = {_key(c) for c in open_candidates(grid, rows)}
        wanted = [(choice.num_workers, choice.global_batch), *choice.ties,
                  *_knee_neighbours(choice, grid, self.context["objective"])]
        todo = [Candidate(n, b) for n, b in dict.fromkeys(wanted) if (n, b) in open_keys]
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


def _knee_neighbours(choice, grid: Sequence[Candidate], objective: str) -> list[tuple[int, int]]:
    """For the knee, the next smaller and larger batch at the chosen N: a knee is a
    property of the curve's shape around it, which these measurements pin down."""
    if objective != "knee":
        return []
    batches = sorted(c.global_batch for c in grid if c.num_workers == choice.num_workers)
    i = batches.index(choice.global_batch) if choice.global_batch in batches else -1
    if i < 0:
        return []
    return [(choice.num_workers, batches[j]) for j in (i - 1, i + 1) if 0 <= j < len(batches)]


STRATEGIES: dict[str, Callable[..., SearchStrategy]] = {
    "full": FullSearch,
    "partial": PartialSearch,
    "adaptive": AdaptiveSearch,
}


def with_plan_context(name: str, options: dict[str, Any] | None,
                      **context: Any) -> dict[str, Any]:
    """`options` for the strategy `name`, plus the plan's context (objective, epochs,
    dataset_size, pricing, ... as JSON) when that strategy plans as it goes
    (`needs_plan_context`, e.g. adaptive); the other strategies take no context."""
    merged = dict(options or {})
    if getattr(STRATEGIES[name], "needs_plan_context", False):
        merged.update(context)
    return merged


def register_strategy(name: str, factory: Callable[..., SearchStrategy]) -> None:
    """Add a search strategy: `factory(**options)` returns an object with `name`,
    `propose(grid, rows)` and `fit_rows(rows)` (see `SearchStrategy`)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"strategy name {name!r}; it must be a non-empty string")
    STRATEGIES[name] = factory


def make_strategy(name: str, options: dict[str, Any] | None = None) -> SearchStrategy:
    """The registered strategy `name`, built with `options`; a clear error otherwise."""
    if name not in STRATEGIES:
        raise ValueError(f"search strategy {name!r} is unknown; use one of {sorted(STRATEGIES)} "
                         "(or add one with tula_ray.search_strategies.register_strategy)")
    try:
        return STRATEGIES[name](**dict(options or {}))
    except TypeError as exc:
        raise ValueError(f"strategy_options={dict(options or {})!r} do not fit search "
                         f"strategy {name!r} ({exc})") from exc
