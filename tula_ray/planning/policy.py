"""Configuration selection policy (paper §III-A3).

Chooses one (N, B) from the predicted candidates: the fastest, the cheapest,
the knee of the time-vs-batch curve (Kneedle, paper [32], via `kneed`), or a
weighted balance of time and cost, among the feasible candidates only. The same
for a target accuracy (issue 25): the fastest or cheapest to it, or the knee of the
time-to-accuracy curve, which falls and then rises again past the batch where more
epochs outweigh faster ones: its knee is found on the falling part.

Where candidates tie within the uncertainty of the estimates, the tie is broken by
`TIE_BREAK_RULE` (fewest workers, then smallest global batch), not by the central
estimate: the same tied set gives the same choice, whatever the timing noise (issue:
`tula-ray demo` chose differently run to run).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd

from tula_ray.arguments import check_choice, check_number

OBJECTIVES = ("time", "cost", "knee", "weighted",
              "time_to_accuracy", "cost_to_accuracy", "knee_to_accuracy")
# The table column each objective minimises; a knee objective's is the curve it bends.
OBJECTIVE_METRICS = {"time": "total_time_s", "cost": "cost_usd", "knee": "total_time_s",
                     "time_to_accuracy": "time_to_accuracy_s",
                     "cost_to_accuracy": "cost_to_accuracy_usd",
                     "knee_to_accuracy": "time_to_accuracy_s"}
KNEE_OBJECTIVES = ("knee", "knee_to_accuracy")
# Objectives to the accuracy the plan's epochs reach at the reference batch (issue 25),
# ranked on each candidate's epochs to that target rather than on the plan's epochs.
ACCURACY_OBJECTIVES = ("time_to_accuracy", "cost_to_accuracy", "knee_to_accuracy")
WEIGHT_TIME_DEFAULT = 0.5  # "weighted": equal say to time and cost
# When Kneedle finds no knee (e.g. a curve that never flattens, or rises), we
# take the smallest batch whose time is within this fraction of the best one:
# the same "diminishing returns" idea, stated as a tolerance.
KNEE_FALLBACK_TOLERANCE = 0.05
MAX_KNEE_TILT = 0.9  # the largest relative tilt of a curve when looking for knee ties
# How a tie within the uncertainty is broken. Both keys are fixed properties of a
# candidate, so the choice depends on the tied set alone, never on timing noise (breaking
# it by time or cost, i.e. by the central estimate, brings the noise back). Fewer workers
# is the cheaper cluster for the same predicted result; a smaller global batch generalises
# better (the generalization gap, paper §II-B and Fig. 2).
TIE_BREAK_RULE = "fewest workers, then smallest global batch"


@dataclass(frozen=True)
class Choice:
    """The chosen configuration and why it was chosen."""

    num_workers: int
    global_batch: int
    objective: str
    reason: str
    knee_global_batch: float | None = None  # the knee on the dense curve, before snapping
    # The other candidates of the set that ties within the uncertainty of the estimates
    # ((N, B) pairs, the choice excluded; the central estimate's own pick among them when
    # the tie-break chose another), and how the tie was broken ("" where none tied).
    ties: tuple[tuple[int, int], ...] = ()
    tie_break: str = ""
    # An adaptive run at num_workers (issue 44): global_batch is the batch it starts at,
    # and the batch follows the noise scale (`tula_ray.planning.adaptive_rows`).
    adaptive: bool = False

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.num_workers

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ties"] = [list(pair) for pair in self.ties]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Choice":
        data = dict(data)
        data["ties"] = tuple((int(n), int(b)) for n, b in data.get("ties", ()))
        return cls(**data)

    def describe_ties(self) -> str:
        """One line for the plan's summary: the tie and how it was broken, or '' if none."""
        if not self.ties:
            return ""
        named = ", ".join(f"N={n} B={b}" for n, b in self.ties)
        return f"tied within the uncertainty with {named}; broken by {self.tie_break}"


def find_knee(global_batch: np.ndarray, metric: np.ndarray) -> float | None:
    """Kneedle's knee of a decreasing, convex curve, with x = log2(B); None if there is none.

    Where Kneedle finds several knees (local maxima of its difference curve: a dense curve
    bent through measurements has small ones), the knee is the most pronounced, the
    maximum of the difference curve, not the first: the same point on a dense curve as on
    the few candidate points it passes through (kneed alone returns the first)."""
    x = np.log2(np.asarray(global_batch, dtype=float))
    y = np.asarray(metric, dtype=float)
    if len(x) < 3 or not y[0] > y[-1]:
        return None  # Kneedle's "decreasing" knee is meaningless on a flat or rising curve
    from kneed import KneeLocator  # here: kneed pulls in matplotlib, ~1 s per import

    locator = KneeLocator(x, y, curve="convex", direction="decreasing")
    if locator.knee is None:
        return None
    return float(2.0 ** locator.x[int(np.argmax(locator.y_difference))])


def envelope(dense: pd.DataFrame, metric: str) -> pd.DataFrame:
    """For each global batch, the feasible cluster size with the lowest `metric`."""
    feasible = dense[dense["feasible"]]
    best = feasible.loc[feasible.groupby("global_batch")[metric].idxmin()]
    return best.sort_values("global_batch").reset_index(drop=True)


def check_objective(objective: str) -> str:
    """One of `OBJECTIVES` (the plan's context checks it with this, and `choose` again for
    a caller that chooses on a table of its own)."""
    return check_choice("objective", objective, OBJECTIVES)


def check_weight_time(weight_time: float) -> float:
    """The weighted objective's share of time, within [0, 1]."""
    return check_number("weight_time", weight_time, low=0.0, high=1.0,
                        hint="the weighted objective's share of time, the rest cost's")


def _check(objective: str, weight_time: float) -> None:
    check_objective(objective)
    check_weight_time(weight_time)


def _feasible(table: pd.DataFrame) -> pd.DataFrame:
    feasible = table[table["feasible"]]
    if feasible.empty:
        reasons = sorted(set(table.get("infeasible_reason", pd.Series(dtype=str))) - {""})
        raise ValueError(
            f"no feasible candidate among {len(table)} (reasons: {reasons or 'none given'}); "
            "relax the constraints (max_workers, max_batch), give the device more memory, "
            "or lower min_batch"
        )
    return feasible


def _row_choice(row: pd.Series, objective: str, reason: str, knee: float | None = None) -> Choice:
    return Choice(int(row["num_workers"]), int(row["global_batch"]), objective, reason, knee)


def falling_part(curve: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The curve up to its minimum: a knee is where the fall flattens, and past the
    minimum the curve rises (time to accuracy: more epochs outweigh faster ones)."""
    return curve.iloc[: int(np.argmin(curve[metric].to_numpy(float))) + 1]


def _knee(feasible: pd.DataFrame, dense: pd.DataFrame | None, metric: str,
          objective: str = "knee") -> Choice:
    curve = envelope(dense if dense is not None else feasible, metric)
    if objective == "knee_to_accuracy":
        curve = falling_part(curve, metric)
    knee = find_knee(curve["global_batch"], curve[metric])
    if knee is None:
        limit = curve[metric].min() * (1.0 + KNEE_FALLBACK_TOLERANCE)
        target = float(curve[curve[metric] <= limit]["global_batch"].min())
        how = (f"no knee found by Kneedle; fallback: smallest batch within "
               f"{KNEE_FALLBACK_TOLERANCE:.0%} of the best {metric}")
    else:
        target = knee
        how = f"knee of the predicted {metric} curve vs log2(B) at B~{knee:.0f} (Kneedle)"
    # Snap to the nearest candidate batch (in log2), then the best N for that batch.
    distance = np.abs(np.log2(feasible["global_batch"].to_numpy(float)) - np.log2(target))
    nearest = feasible[distance == distance.min()]
    row = nearest.loc[nearest[metric].idxmin()]
    return _row_choice(row, objective, how, knee)


def _minimum_ties(feasible: pd.DataFrame, score: pd.Series, chosen: int,
                  uncertainty: pd.Series | None) -> tuple[tuple[int, int], ...]:
    """Rows whose interval score * (1 +- u) overlaps the chosen row's: a tie within noise."""
    if uncertainty is None:
        return ()
    u = uncertainty.reindex(feasible.index).fillna(0.0).clip(lower=0.0)
    best_high = score[chosen] * (1.0 + u[chosen])
    tied = feasible[(score * (1.0 - u) <= best_high) & (feasible.index != chosen)]
    return tuple((int(n), int(b)) for n, b in zip(tied["num_workers"], tied["global_batch"]))


def _knee_ties(feasible: pd.DataFrame, dense: pd.DataFrame | None, metric: str, chosen: Choice,
               dense_uncertainty: float | None,
               uncertainty: pd.Series | None = None) -> tuple[tuple[int, int], ...]:
    """The candidates the knee snaps to when the curve is tilted within its uncertainty:
    metric * (1 + u t) and metric * (1 - u t), t from -1 at the smallest B to +1 at the
    largest (linear in log2 B), the two shapes that move a knee the most. With the rows'
    own `uncertainty`, also the cluster sizes that tie (`_minimum_ties` on `metric`) at
    each batch the knee lands on: the knee fixes B, the lowest `metric` picks N there."""
    landings = {(chosen.num_workers, chosen.global_batch)}
    if dense is not None and dense_uncertainty and np.isfinite(dense_uncertainty):
        # Beyond +-100 % the tilted curve would cross zero: cap the tilt below it.
        u = min(float(dense_uncertainty), MAX_KNEE_TILT)
        x = np.log2(dense["global_batch"].to_numpy(float))
        t = (2 * (x - x.min()) / max(x.max() - x.min(), 1e-12)) - 1.0
        for sign in (1.0, -1.0):
            tilted = dense.assign(**{metric: dense[metric] * (1.0 + sign * u * t)})
            other = _knee(feasible, tilted, metric, chosen.objective)
            landings.add((other.num_workers, other.global_batch))
    picks = set(landings)
    for n, b in landings:
        same_batch = feasible[feasible["global_batch"] == b]
        landed = same_batch.index[same_batch["num_workers"] == n][0]
        picks.update(_minimum_ties(same_batch, same_batch[metric], landed, uncertainty))
    picks.discard((chosen.num_workers, chosen.global_batch))
    return tuple(sorted(picks))


def _break_tie(central: Choice, ties: tuple[tuple[int, int], ...]) -> Choice:
    """The choice among the tied set (the central estimate's pick and its `ties`) by
    `TIE_BREAK_RULE`: (N, B) pairs sort by fewest workers, then smallest global batch."""
    central_pair = (central.num_workers, central.global_batch)
    tied = sorted({central_pair, *ties})
    if len(tied) == 1:
        return replace(central, ties=(), tie_break="")
    final = tied[0]
    agrees = ("the central estimate agrees" if final == central_pair else
              f"the central estimate alone would choose N={central_pair[0]}, "
              f"B={central_pair[1]}")
    how = f"{TIE_BREAK_RULE}, among the {len(tied)} tied candidates ({agrees})"
    reason = central.reason if final == central_pair else \
        f"{central.reason}, within the uncertainty"
    return replace(central, num_workers=final[0], global_batch=final[1], reason=reason,
                   ties=tuple(pair for pair in tied if pair != final), tie_break=how)


def choose(
    table: pd.DataFrame,
    objective: str = "knee",
    *,
    dense: pd.DataFrame | None = None,
    weight_time: float = WEIGHT_TIME_DEFAULT,
    knee_metric: str = "total_time_s",
    uncertainty: str | None = None,
    dense_uncertainty: float | None = None,
) -> Choice:
    """The choice (see `_choose`), with the candidates that tie with it within the
    uncertainty: `table[uncertainty]` is each row's relative uncertainty (a measured
    row's spread, a predicted row's interval); `dense_uncertainty` that of the dense
    curve the knee is found on. The tied set is the central estimate's choice plus the
    candidates that tie with it (for a knee objective: where the knee lands on the curve
    tilted within its uncertainty, and the cluster sizes tied at those batches); the
    choice is its member by `TIE_BREAK_RULE`, and the Choice names the others and the
    rule. Without `uncertainty`, the central estimate's choice."""
    choice = _choose(table, objective, dense=dense, weight_time=weight_time,
                     knee_metric=knee_metric)
    if uncertainty is None:
        return choice
    feasible = _feasible(table)
    u = feasible[uncertainty] if uncertainty in feasible else None
    if objective in KNEE_OBJECTIVES:
        ties = _knee_ties(feasible, dense, _knee_metric(objective, knee_metric), choice,
                          dense_uncertainty, u)
    else:
        score = _score(feasible, objective, weight_time)
        chosen = feasible[(feasible["num_workers"] == choice.num_workers)
                          & (feasible["global_batch"] == choice.global_batch)].index[0]
        ties = _minimum_ties(feasible, score, chosen, u)
    return _break_tie(choice, ties)


def _knee_metric(objective: str, knee_metric: str) -> str:
    """The curve a knee objective bends: `knee_metric` for the fixed-epoch knee (the
    caller's choice of curve), time to accuracy for the to-accuracy knee."""
    return knee_metric if objective == "knee" else OBJECTIVE_METRICS[objective]


def _score(feasible: pd.DataFrame, objective: str, weight_time: float) -> pd.Series:
    if objective in OBJECTIVE_METRICS:
        return _column(feasible, OBJECTIVE_METRICS[objective], objective)
    return (weight_time * feasible["total_time_s"] / feasible["total_time_s"].min()
            + (1 - weight_time) * feasible["cost_usd"] / feasible["cost_usd"].min())


def _choose(
    table: pd.DataFrame,
    objective: str = "knee",
    *,
    dense: pd.DataFrame | None = None,
    weight_time: float = WEIGHT_TIME_DEFAULT,
    knee_metric: str = "total_time_s",
) -> Choice:
    """Pick the candidate that best meets `objective` among the feasible rows of `table`.

    table: one row per candidate with num_workers, global_batch, total_time_s,
      cost_usd and a boolean `feasible` (constraints already applied); the to-accuracy
      objectives rank on time_to_accuracy_s or cost_to_accuracy_usd.
    dense: the model's predictions on a dense batch grid (same columns), used
      for the knee so that it does not depend on how coarse the candidate grid is.
    weight_time: for "weighted", the weight of time in
      weight_time * T / T_best + (1 - weight_time) * C / C_best.
    """
    _check(objective, weight_time)
    feasible = _feasible(table)
    if objective in KNEE_OBJECTIVES:
        metric = _knee_metric(objective, knee_metric)
        _column(feasible, metric, objective)
        return _knee(feasible, dense, metric, objective)
    row = feasible.loc[_score(feasible, objective, weight_time).idxmin()]
    reason = {"time": "lowest training time", "cost": "lowest training cost",
              "weighted": f"best weighted score (time weight {weight_time:g})",
              "time_to_accuracy": "lowest time to the target accuracy",
              "cost_to_accuracy": "lowest cost to the target accuracy"}[objective]
    return _row_choice(row, objective, reason)


def _column(feasible: pd.DataFrame, column: str, objective: str) -> pd.Series:
    """The column an objective ranks on; a clear error when the table lacks it (a table
    built without the gradient noise has no time to accuracy)."""
    if column not in feasible:
        raise ValueError(f"objective {objective!r} ranks on {column!r}, which this table "
                         f"lacks (columns: {sorted(feasible.columns)}); plans made by "
                         "build_plan have it")
    return feasible[column]
