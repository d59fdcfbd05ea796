"""The plan's summary as a person reads it (issue 41, item 5): a table that fits in
`tula_ray.verbosity.LINE_WIDTH` columns, the rows that matter when there are many, and the
plan's prose wrapped to the same width. The full table (every candidate, every column)
stays in `Plan.table` and the plan's JSON; this module only chooses what to print.
"""

from __future__ import annotations

import pandas as pd

from tula_ray.planning.accuracy import ProfiledNoise
from tula_ray.planning.noise_trajectory import NoiseTrajectory
from tula_ray.planning.policy import ACCURACY_OBJECTIVES, Choice
from tula_ray.verbosity import LINE_WIDTH, wrap

# A plan of at most this many candidates prints them all; a larger one prints the choice,
# its ties and the best of each N (`rows_that_matter`), and says where the rest are.
ALL_ROWS_UP_TO = 8
# The objectives ranked by cost; the others by time (`tula_ray.planning.policy`).
COST_OBJECTIVES = ("cost", "cost_to_accuracy")
NOTE_WIDTH = 24  # the last column's words: the choice, a tie, the best of its N, or why not


def _objective_column(objective: str) -> str:
    """The column a candidate is best by for `objective` (the knee's curve is time's)."""
    cost = objective in COST_OBJECTIVES
    if objective in ACCURACY_OBJECTIVES:
        return "cost_to_accuracy_usd" if cost else "time_to_accuracy_s"
    return "estimated_cost_usd" if cost else "estimated_total_time_s"


def _pairs(table: pd.DataFrame) -> list[tuple[int, int]]:
    return list(zip(table["num_workers"].astype(int), table["global_batch"].astype(int)))


def best_per_size(table: pd.DataFrame, objective: str) -> dict[int, tuple[int, int]]:
    """N -> the feasible (N, B) of that N best by the objective's figure (fastest or
    cheapest, over the plan's epochs or to the target accuracy)."""
    column = _objective_column(objective)
    feasible = table[table["feasible"].astype(bool) & table[column].notna()]
    best = feasible.loc[feasible.groupby("num_workers")[column].idxmin()]
    return {int(n): (int(n), int(b)) for n, b in _pairs(best)}


def notes(table: pd.DataFrame, choice: Choice, objective: str) -> list[str]:
    """Per row of `table`: "choice", "tie", "best of N=n", or why it is infeasible."""
    best = set(best_per_size(table, objective).values())
    ties = set(choice.ties)
    words = []
    for (n, b), reason in zip(_pairs(table), table["infeasible_reason"]):
        if (n, b) == (choice.num_workers, choice.global_batch):
            words.append("adaptive starts here" if choice.adaptive else "choice")
        elif (n, b) in ties:
            words.append("tie")
        elif reason:
            words.append(_shortened(f"no: {reason}", NOTE_WIDTH))
        elif (n, b) in best:
            words.append(f"best of N={n}")
        else:
            words.append("")
    return words


def _shortened(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def rows_that_matter(table: pd.DataFrame, choice: Choice, objective: str) -> pd.DataFrame:
    """The choice, its ties and the best of each N; every row of a small plan."""
    if len(table) <= ALL_ROWS_UP_TO:
        return table
    kept = {(choice.num_workers, choice.global_batch), *choice.ties,
            *best_per_size(table, objective).values()}
    return table[[pair in kept for pair in _pairs(table)]]


def compact_table(table: pd.DataFrame, choice: Choice, objective: str) -> str:
    """`table`'s rows in at most LINE_WIDTH columns: N, B, b, the step and epoch times (ms,
    s), the plan's training time, the time to the target accuracy, the cost, the peak
    memory (MiB) (each the measured figure where the candidate was profiled: `from`),
    and a note."""
    measured = table["estimate"] == "measured"
    shown = pd.DataFrame({
        "N": table["num_workers"].astype(int), "B": table["global_batch"].astype(int),
        "b": table["local_batch"].astype(int),
        "step_ms": 1e3 * table["measured_step_time_s"].where(measured, table["step_time_s"]),
        "epoch_s": table["measured_epoch_time_s"].where(measured, table["epoch_time_s"]),
        "total_s": table["estimated_total_time_s"],
        "target_s": table.get("time_to_accuracy_s", pd.Series(float("nan"), table.index)),
        "cost_usd": table["estimated_cost_usd"],
        "peak_MiB": table["estimated_peak_mem_bytes"] / 2**20,
        "from": table["estimate"],  # "measured" or "predicted"
        "note": notes(table, choice, objective)})
    width = max(len("note"), *(len(note) for note in shown["note"]))
    text = shown.to_string(index=False, float_format=lambda v: f"{v:.4g}",
                           formatters={"note": f"{{:<{width}}}".format}, line_width=LINE_WIDTH)
    return "\n".join(line.rstrip() for line in text.splitlines())


def shown_rows_line(shown: int, total: int) -> str:
    """What the table leaves out, and where it is."""
    return (f"{shown} of {total} candidates shown (the choice, its ties, the best of each N); "
            "all in plan.json")


def adaptive_line(adaptive: pd.DataFrame, trajectory: NoiseTrajectory) -> str:
    """One line: each N's adaptive run (its time to the target, its batches, against the
    best fixed batch under the same trajectory) and the trajectory it follows."""
    runs = "; ".join(
        f"N={int(row.num_workers)} {row.time_to_accuracy_s:.4g} s ({row.batches}"
        + (f", accumulating up to {int(row.accumulation_steps)} micro-steps"
           if row.accumulation_steps > 1 else "")
        + f"; fixed B={int(row.fixed_batch)} {row.fixed_time_to_accuracy_s:.4g} s)"
        for row in adaptive.itertuples()) if not adaptive.empty else "none"
    return (f"adaptive batch to the target (plan.adaptive): {runs}; noise scale trajectory "
            f"(meta['noise_trajectory']): {trajectory.describe()}")


def strategy_cost_line(meta: dict, profiles: pd.DataFrame, table: pd.DataFrame) -> str:
    """What the training times include of the training strategy's own cost per step."""
    name = meta.get("training_strategy")
    measured = "strategy_extra_s" in profiles and \
        profiles["strategy_extra_s"].notna().any()
    if measured:
        extra = table.groupby("num_workers")["strategy_extra_s"].max()
        per_n = ", ".join(f"N={n}: +{1e3 * v:.3g} ms" for n, v in extra.items())
        text = (f"training times include {name or 'the training strategy'}'s measured "
                f"cost per step ({per_n})")
        if "plain_steps" in table and table["plain_steps"].any():
            plain = table[table["plain_steps"].astype(bool)]
            text += (", except where it trains plain optimizer steps (B <= "
                     f"{int(plain['global_batch'].max())})")
        return text
    if name:
        return (f"training times: plain optimizer steps ({name}'s cost per step was not "
                "measured: no profiled batch suits it)")
    return "training times: plain optimizer steps (no training strategy measured)"


def choice_line(choice: Choice) -> str:
    """The choice: N, its batch (or the batch an adaptive run starts at), and why."""
    batch = (f"adaptive batch from B={choice.global_batch}" if choice.adaptive else
             f"B={choice.global_batch} (b={choice.local_batch})")
    return f"choice ({choice.objective}): N={choice.num_workers}, {batch} - {choice.reason}"


def noise_lines(meta: dict, adaptive: pd.DataFrame) -> list[str]:
    """The plan's noise scale (meta["noise"]) and, where it has a trajectory, its adaptive
    rows (`adaptive_line`)."""
    lines = []
    if "noise" in meta:
        lines.append(ProfiledNoise.from_dict(meta["noise"]).describe(meta["reference_batch"]))
    if meta.get("noise_trajectory"):
        lines.append(adaptive_line(adaptive, NoiseTrajectory.from_dict(meta["noise_trajectory"])))
    return lines


def search_cost_line(cost: dict | None) -> str:
    """What the search itself cost (meta["search_cost"]: `tula_ray.planning.search_cost`):
    its node-hours, the memory probe's and each N's; "" for a plan without it (built
    offline, or saved before it was recorded)."""
    if not cost:
        return ""
    parts = [f"memory probe: {cost['probe']['node_hours']:.3g}"] + [
        f"N={entry['num_workers']}: {entry['node_hours']:.3g} in {entry['launches']} "
        f"launch{'es' if entry['launches'] != 1 else ''}" for entry in cost["by_num_workers"]]
    usd = f", ${cost['usd']:.3g} at the plan's price" if "usd" in cost else ""
    return f"the search: {cost['node_hours']:.3g} node-hours ({'; '.join(parts)}){usd}"


def wrapped(lines: list[str]) -> str:
    """The summary's lines, each wrapped to LINE_WIDTH."""
    return "\n".join(wrap(line) for line in lines if line)
