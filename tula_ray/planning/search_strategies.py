"""Search strategies: which (N, B) candidates to profile next, and when the search is done.

One protocol, `SearchStrategy`, and a registry, `SEARCH_STRATEGIES`: full and partial search
(paper §III-A2) are registered here, adaptive search in its own module
(tula_ray.planning.adaptive_search, which plans as it goes); a fourth strategy is one
`register_search_strategy` call.
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

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import pandas as pd

from tula_ray.arguments import check_bool, check_int, check_text
from tula_ray.planning.context import PlanContext
from tula_ray.profile_table import STATUS_OK, oom_local_batch, usable
from tula_ray.space import Candidate, corner_sizes, corners, middle


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


def candidate_key(candidate: Candidate) -> tuple[int, int]:
    return candidate.num_workers, candidate.global_batch


def measured_keys(rows: pd.DataFrame) -> set[tuple[int, int]]:
    """(N, B) of every row, whatever its status: a candidate is profiled at most once."""
    return set(zip(rows["num_workers"].astype(int), rows["global_batch"].astype(int)))


def open_candidates(grid: Sequence[Candidate], rows: pd.DataFrame) -> list[Candidate]:
    """Candidates with no row yet and a local batch below every out-of-memory one
    (memory per worker depends on b only: an OOM at b rules out b' >= b for every N)."""
    done, bound = measured_keys(rows), oom_local_batch(rows)
    return [c for c in grid if candidate_key(c) not in done and c.local_batch < bound]


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
    """The extremes: min/max N x min/max B (paper §III-A2, "partial search"), and the
    largest N on one node where nodes hold `workers_per_node` workers (issue 26).

    A corner that ran out of memory or crashed is replaced by the next batch inward at
    the same N (paper §IV-B: "relaunching progressively smaller batches until a
    feasible configuration is found"), so that the model stays identified.

    middle=True (the default; beyond the paper, issue 24) also times, at each of those
    N, the batch nearest the geometric middle of the two ends (`space.middle`), in the
    same worker group: no launch more. The cost per sample is not constant in b (on
    CPUs it falls and rises again), and a curve through two ends over-predicted the
    batches between them by 20-30 %; with the middle, eq. 2b's fit can bend
    (`compute_forms`). middle=False is the paper's two batches per N. A middle that
    fails is not replaced: the ends identify the model.
    """

    name = "partial"

    def __init__(self, *, workers_per_node: int | None = None, middle: bool = True) -> None:
        # G, the workers one node holds: the largest N <= G is a corner too (`corner_sizes`)
        check_int("workers_per_node", workers_per_node, minimum=1, optional=True)
        self.workers_per_node = workers_per_node
        self.middle = check_bool("middle", middle)

    def propose(self, grid: Sequence[Candidate], rows: pd.DataFrame) -> Proposal:
        status = {(int(n), int(b)): s for n, b, s in
                  zip(rows["num_workers"], rows["global_batch"], rows["status"])}
        bound = oom_local_batch(rows)
        needed = []
        for n in corner_sizes([c.num_workers for c in grid], self.workers_per_node):
            at_n = sorted((c for c in grid if c.num_workers == n), key=lambda c: c.global_batch)
            for side in (at_n, at_n[::-1]):  # the smallest batch, then the largest
                for candidate in side:
                    state = status.get(candidate_key(candidate))
                    if state is None and candidate.local_batch < bound:
                        needed.append(candidate)
                        break
                    if state == STATUS_OK:
                        break  # this side is covered; failed or too large: try inward
            centre = middle(at_n) if self.middle else None
            if centre is not None and candidate_key(centre) not in status \
                    and centre.local_batch < bound:
                needed.append(centre)
        needed = list(dict.fromkeys(needed))
        if needed:
            return Proposal(tuple(needed), "partial search: the extremes of N and B "
                                           + ("and the middle B " if self.middle else "")
                                           + "(the next batch inward where an end failed)")
        return Proposal((), "partial search: every extreme is profiled")

    def fit_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """The usable rows at the corners of what was measured: min/max N x min/max B,
        and with middle=True the middle B measured at each of those N."""
        ok = usable(rows)
        if ok.empty:
            return ok
        pairs = [Candidate(int(n), int(b)) for n, b in zip(ok["num_workers"], ok["global_batch"])]
        kept = corners(pairs, self.workers_per_node)
        if self.middle:  # at each corner N, the middle of what was measured there
            centres = (middle(c for c in pairs if c.num_workers == n)
                       for n in sorted({c.num_workers for c in kept}))
            kept += [c for c in centres if c is not None]
        keep = {candidate_key(c) for c in kept}
        picked = [(int(n), int(b)) in keep for n, b in zip(ok["num_workers"], ok["global_batch"])]
        return ok[picked].reset_index(drop=True)


SEARCH_STRATEGIES: dict[str, Callable[..., SearchStrategy]] = {
    "full": FullSearch,
    "partial": PartialSearch,
}
SEARCH_STRATEGY_DEFAULT = "partial"  # paper §III-C: the corners (and middles) only


def with_plan_context(name: str, options: dict[str, Any] | None,
                      context: PlanContext) -> dict[str, Any]:
    """`options` for the strategy `name`, plus the plan's context as one JSON object
    (`plan_context`) when that strategy plans as it goes (`needs_plan_context`, e.g.
    adaptive); the other strategies take no context."""
    merged = dict(options or {})
    if getattr(SEARCH_STRATEGIES[name], "needs_plan_context", False):
        merged["plan_context"] = context.to_dict()
    return merged


def topology_options(name: str, options: dict[str, Any] | None,
                     workers_per_node: int | None) -> dict[str, Any]:
    """`options` for the strategy `name`, plus `workers_per_node` when that strategy takes
    it (partial and adaptive profile the largest one-node N as a corner) and it is known."""
    merged = dict(options or {})
    factory = SEARCH_STRATEGIES[name]
    try:
        takes = "workers_per_node" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C factory: no signature to read
        takes = False
    if takes and workers_per_node is not None:
        merged.setdefault("workers_per_node", int(workers_per_node))
    return merged


def register_search_strategy(name: str, factory: Callable[..., SearchStrategy]) -> None:
    """Add a search strategy: `factory(**options)` returns an object with `name`,
    `propose(grid, rows)` and `fit_rows(rows)` (see `SearchStrategy`)."""
    check_text("name", name, hint="the search strategy's name")
    SEARCH_STRATEGIES[name] = factory


def make_search_strategy(name: str, options: dict[str, Any] | None = None) -> SearchStrategy:
    """The registered strategy `name`, built with `options`; a clear error otherwise."""
    if name not in SEARCH_STRATEGIES:
        raise ValueError(f"search strategy {name!r} is unknown; use one of "
                         f"{sorted(SEARCH_STRATEGIES)} (or add one with "
                         "tula_ray.register_search_strategy)")
    try:
        return SEARCH_STRATEGIES[name](**dict(options or {}))
    except TypeError as exc:
        raise ValueError(f"strategy_options={dict(options or {})!r} do not fit search "
                         f"strategy {name!r} ({exc})") from exc
