"""Figures of a Plan: time and cost vs global batch per cluster size (paper Fig. 9 and 10)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only: plotting must work on a headless cluster head node
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from tula_ray.planning.plan import Plan

FIGURES = (  # (file stem, predicted column, measured column, axis label)
    ("time_vs_batch", "total_time_s", "measured_total_time_s", "training time (s)"),
    ("cost_vs_batch", "cost_usd", None, "training cost (USD)"),
)


def plot_plan(plan: "Plan", directory: Path) -> list[Path]:
    """One PNG per figure in `directory`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, predicted, measured, label in FIGURES:
        figure, axis = plt.subplots(figsize=(6.4, 4.2))
        for n, rows in plan.table.groupby("num_workers"):
            rows = rows.sort_values("global_batch")
            line, = axis.plot(rows["global_batch"], rows[predicted], "--", label=f"N={n} predicted")
            if measured is not None:
                axis.plot(rows["global_batch"], rows[measured], "o", color=line.get_color(),
                          label=f"N={n} measured")
            infeasible = rows[~rows["feasible"].astype(bool)]
            axis.plot(infeasible["global_batch"], infeasible[predicted], "x", color="grey")
        chosen = plan.chosen
        axis.plot(chosen["global_batch"], chosen[predicted], "*", markersize=16, color="crimson",
                  label=f"choice ({plan.choice.objective}): N={plan.choice.num_workers}, "
                        f"B={plan.choice.global_batch}"
                        + (" (adaptive: its start)" if plan.choice.adaptive else ""))
        if plan.choice.knee_global_batch is not None:
            axis.axvline(plan.choice.knee_global_batch, color="grey", linestyle=":",
                         label=f"knee B~{plan.choice.knee_global_batch:.0f}")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("global batch size B")
        axis.set_ylabel(label)
        axis.set_title(f"{plan.workload}: {plan.search_strategy} search, {plan.perf.form} model")
        axis.legend(fontsize="small")
        figure.tight_layout()
        path = directory / f"{stem}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
