"""The generalization benchmark's report (`benchmarks.training.generalization`), from the runs
finished so far: the summary per B and strategy, issue 12's goals, the safest strategy
when B is not known in advance, the Fig. 7 analog (where AGS's steps fall against its
gate) and the markdown."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

import benchmarks.training.tuning as tuning  # a sibling module, not the package face
from benchmarks.common import RESULTS_DIR, Benchmark, markdown_table, read_runs
from benchmarks.training.generalization_runs import (LARGE_BATCHES, NAME, REFERENCE_BATCH,
                                                     STRATEGY_RUNS, WORLD_SIZE, run_key, variant)
from tula_ray.ags import DELTA_DEFAULT
from tula_ray.training.ags_strategy import NOISE_SCALE_DEFAULTS

# A run diverged when its last epoch's training loss is not finite or its test accuracy is
# at chance level (10 classes) or below: lrs at B=2048 ended at 10 % in 2 of 3 seeds.
CHANCE_ACCURACY = 0.1
AGS_LABELS = ("ags", "ags-ns")  # the paper's algorithm and the variant beyond it
BASELINES = ("lbt", "lrs", "lars", "polo")
GOAL_REFERENCE_GAP = 0.01  # issue 12: within 1 point of the B = 32 reference at B = 1024


def record(quick: bool = False, batches: tuple[int, ...] = LARGE_BATCHES) -> dict:
    """The result, its tables and plot from the runs finished so far (`run` resumes the
    rest): an interrupted benchmark still reports what it measured, with its seed counts."""
    name, settings, runs, log = variant(quick, batches)
    planned = {run_key(p) for p in runs}
    finished = [r for r in read_runs(log) if run_key(r) in planned]
    # The runs came from `run` (possibly over several sessions and commits: the log
    # resumes); the command is the one that runs them, whoever rebuilds the table.
    command = f"{Path(sys.executable).name} -m benchmarks generalization" + (
        " --quick" if quick else "")
    summary, seeds = _summary(finished), len(settings["seeds"])
    result = {"command": command, "name": name,
              "planned_runs": len(runs), **{k: list(v) if isinstance(v, tuple) else v
                                 for k, v in settings.items()},
              "world_size": WORLD_SIZE, "reference_batch": REFERENCE_BATCH,
              "summary": summary, "runs": finished, "goals": _goals(summary, batches, seeds),
              "shortfalls": {kind: _shortfalls(summary, batches, seeds, labels)
                             for kind, labels in (("recipe", list(STRATEGY_RUNS)), (
                                 "tuned", [k + tuning.TUNED_SUFFIX for k in STRATEGY_RUNS]))},
              "variability_plot": f"{name}_variability.png", "delta": DELTA_DEFAULT,
              "tuned": [] if quick else list(tuning.read_tuned().values()),
              "tuning": {"global_batch": tuning.TUNE_BATCH, "trials": tuning.TRIALS}}
    _plot_variability(finished, RESULTS_DIR / result["variability_plot"])
    return Benchmark(NAME, quick).record(result, report)


def _gate(run: dict) -> float | None:
    """The run's variability gate delta (None: no gate, every step scaled)."""
    defaults = NOISE_SCALE_DEFAULTS if run["strategy"] == "ags-ns" else {}
    return {"delta": DELTA_DEFAULT, **defaults, **run["options"]}["delta"]


def _plot_variability(runs: list[dict], path: Path) -> None:
    """Fig. 7b/d analog: density over AGS's steps of eq. 5's variability, one panel per
    large batch and one curve per label (recipe and tuned); a step left of its run's
    gate delta was scaled. The legend gives each label's gate and the share of steps
    its optimizer scaled (its own count, so a run without a gate shows 100 %)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy.stats import gaussian_kde

    groups: dict[int, dict[str, list[dict]]] = {}
    for r in runs:
        if any(e.get("variability") for e in r["history"]):
            groups.setdefault(r["global_batch"], {}).setdefault(r["label"], []).append(r)
    batches = sorted(groups) or [None]
    figure, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 3.8), squeeze=False)
    for axis, batch in zip(axes[0], batches):
        gates = set()
        for label, group in sorted(groups.get(batch, {}).items()):
            values = [v for r in group for e in r["history"] for v in (e.get("variability") or [])
                      if v is not None and np.isfinite(v) and v > 0]  # the first step's is inf
            scaled = [e["scaled_fraction"] for r in group for e in r["history"]
                      if e.get("scaled_fraction") is not None]
            gate = {_gate(r) for r in group}
            gates |= gate - {None}
            gate_text = ", ".join("off" if g is None else f"{g:.3g}" for g in sorted(
                gate, key=lambda g: (g is None, g or 0)))
            logs = np.log10(values)
            grid = np.linspace(logs.min() - 0.5, logs.max() + 0.5, 300)
            density = gaussian_kde(logs)(grid) if np.ptp(logs) > 0 else np.zeros_like(grid)
            axis.plot(grid, density, label=f"{label} (delta {gate_text}): "
                      f"{statistics.fmean(scaled) if scaled else float('nan'):.0%} scaled")
        for gate in sorted(gates):
            axis.axvline(np.log10(gate), color="crimson", ls=":", lw=1)
        axis.set(xlabel="log10 variability (eq. 5); dotted: each gate delta",
                 ylabel="density over steps", title=f"B = {batch}")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _summary(runs: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["global_batch"], r["label"]), []).append(r)
    rows = []
    for (batch, label), group in sorted(groups.items()):
        accuracies = [r["test_accuracy"] for r in group]
        scaled = [e.get("scaled_fraction") for r in group for e in r["history"]
                  if e.get("scaled_fraction") is not None]
        diverged = sum(1 for r in group if r["test_accuracy"] <= CHANCE_ACCURACY + 0.01
                       or not np.isfinite(r["history"][-1]["train_loss"]))
        rows.append({"global_batch": batch, "label": label, "seeds": len(group),
                     "diverged": diverged,
                     "test_accuracy_mean": statistics.fmean(accuracies),
                     "test_accuracy_std": statistics.stdev(accuracies) if len(group) > 1 else 0.0,
                     "scaled_fraction_mean": statistics.fmean(scaled) if scaled else None,
                     "wall_s_mean": statistics.fmean(r["wall_s"] for r in group),
                     "notes": sorted({n for r in group for n in r.get("notes", [])})})
    return rows


def _goals(summary: list[dict], batches, seeds: int) -> list[dict]:
    """Issue 12's accuracy goals, judged on the finished rows (a row with fewer seeds than
    planned is not judged): untuned, the best AGS recipe >= lrs at 512 and 1024 and >=
    every baseline at 2048 with no diverged seed; tuned, the best tuned AGS >= every tuned
    baseline at each B; AGS (recipe or tuned) within 1 point of the reference at 1024."""
    rows = {(r["global_batch"], r["label"]): r for r in summary if r["seeds"] >= seeds}

    def best(batch: int, labels, every: bool = False) -> dict | None:
        """The best finished row of `labels` at `batch` (None if `every` and one is missing)."""
        found = [rows[batch, label] for label in labels if (batch, label) in rows]
        if not found or (every and len(found) < len(labels)):
            return None
        return max(found, key=lambda r: r["test_accuracy_mean"])

    def goal(text: str, batch: int, ags: dict | None, rival: dict | None, met) -> dict:
        if ags is None or rival is None:
            return {"goal": text, "global_batch": batch, "met": None}
        return {"goal": text, "global_batch": batch, "ags": ags["label"],
                "ags_accuracy": ags["test_accuracy_mean"], "rival": rival["label"],
                "rival_accuracy": rival["test_accuracy_mean"], "met": bool(met(ags, rival))}

    def tuned(labels) -> list[str]:
        return [label + tuning.TUNED_SUFFIX for label in labels]

    goals = []
    for batch in batches:
        rivals = ["lrs"] if batch < max(LARGE_BATCHES) else list(BASELINES)
        named = rivals[0] if len(rivals) == 1 else "every baseline"
        goals.append(goal(f"untuned: best AGS recipe >= {named}, no diverged seed", batch,
                          best(batch, AGS_LABELS), best(batch, rivals, every=True),
                          lambda a, r: a["test_accuracy_mean"] >= r["test_accuracy_mean"]
                          and a["diverged"] == 0))
        goals.append(goal("tuned: best tuned AGS >= every tuned baseline", batch,
                          best(batch, tuned(AGS_LABELS)),
                          best(batch, tuned(BASELINES), every=True),
                          lambda a, r: a["test_accuracy_mean"] >= r["test_accuracy_mean"]))
    if 1024 in batches:
        goals.append(goal(f"best AGS, recipe or tuned, within {GOAL_REFERENCE_GAP * 100:g} "
                          "point of the "
                          f"B = {REFERENCE_BATCH} reference", 1024,
                          best(1024, [*AGS_LABELS, *tuned(AGS_LABELS)]),
                          rows.get((REFERENCE_BATCH, "reference")),
                          lambda a, r: a["test_accuracy_mean"]
                          >= r["test_accuracy_mean"] - GOAL_REFERENCE_GAP))
    return goals


def _shortfalls(summary: list[dict], batches, seeds: int, labels: list[str]) -> list[dict]:
    """Per strategy (`labels`: recipe or tuned), its worst shortfall in mean test accuracy
    against the best of `labels` at each B, and its diverged seeds: the strategy a user
    who does not know B in advance is safest with has no diverged seed and the smallest
    worst shortfall. Only strategies finished at every B; best first."""
    rows = {(r["global_batch"], r["label"]): r for r in summary
            if r["seeds"] >= seeds and r["label"] in labels}
    complete = [label for label in labels if all((b, label) in rows for b in batches)]
    if not complete:
        return []
    best = {b: max(rows[b, label]["test_accuracy_mean"] for label in complete) for b in batches}
    ranked = [{"label": label,
               "worst_shortfall": max(best[b] - rows[b, label]["test_accuracy_mean"]
                                      for b in batches),
               "diverged": sum(rows[b, label]["diverged"] for b in batches),
               "mean_accuracy": statistics.fmean(rows[b, label]["test_accuracy_mean"]
                                                 for b in batches)}
              for label in complete]
    return sorted(ranked, key=lambda r: (r["diverged"] > 0, r["worst_shortfall"]))


def _shortfalls_markdown(shortfalls: dict[str, list[dict]]) -> str:
    parts = []
    for kind, ranked in shortfalls.items():
        if not ranked:
            parts.append(f"{kind}: no strategy finished at every B yet.")
            continue
        table = markdown_table(
            ["strategy", "worst shortfall against the best at a B (points)", "diverged seeds",
             "mean over B"],
            [[r["label"], f"{r['worst_shortfall'] * 100:.2f}", r["diverged"],
              f"{r['mean_accuracy']:.2%}"] for r in ranked])
        parts.append(f"{kind} ({len(ranked)} strategies finished at every B; safest first):\n\n"
                     + table)
    return ("Which strategy is safest when B is not known in advance (the plan picks it): "
            "its worst shortfall against the best strategy at each B, and its diverged "
            "seeds.\n\n" + "\n\n".join(parts))


def _goals_markdown(goals: list[dict]) -> str:
    rows = [[g["goal"], g["global_batch"], "not finished", None, None] if g["met"] is None else
            [g["goal"], g["global_batch"], f"{g['ags']} {g['ags_accuracy']:.2%}",
             f"{g['rival']} {g['rival_accuracy']:.2%}", "yes" if g["met"] else "**no**"]
            for g in goals]
    return ("Issue 12's goals on these rows (means over seeds; the rival is the best of those "
            "the goal names):\n\n" + markdown_table(["goal", "B", "AGS", "rival", "met"], rows))


def _test_set(r: dict) -> str:
    """What the runs were scored on: the full test set, or (--quick) its first images."""
    count = r.get("test_subset")
    return "full test set" if count is None else f"the test set's first {count} images"


def report(r: dict) -> str:
    rows = []
    for row in r["summary"]:
        scaled = "" if row["scaled_fraction_mean"] is None else f"{row['scaled_fraction_mean']:.0%}"
        rows.append([row["global_batch"], row["label"],
                      f"{row['test_accuracy_mean']:.2%} ± {row['test_accuracy_std']:.2%}",
                      row["seeds"], row["diverged"], scaled, f"{row['wall_s_mean']:.0f}"])
    table = markdown_table(["B", "strategy", "test accuracy", "seeds", "diverged", "scaled",
                            "wall per run (s)"], rows)
    notes = sorted({n for row in r["summary"] for n in row["notes"]})
    return f"""### Large-batch generalization: test accuracy per strategy (issues 4 and 5; Table I analog)

`{r['command']}` — table written at commit {r['commit']}, {r['date']}, {r['machine']};
{len(r['runs'])} of {r['planned_runs']} planned runs finished (the runs' log,
`{r['name']}.runs.jsonl`, resumes across sessions: a row with fewer seeds than planned is not finished)

Fashion-MNIST, {r['train_subset']}-image train subset, {_test_set(r)}, small CNN,
{r['epochs']} epochs, N={r['world_size']} gloo workers; accuracy after the last
epoch, mean ± std over seeds (diverged seeds included); "diverged": seeds that ended at
chance accuracy or with a non-finite loss. "scaled" is AGS's fraction of scaled steps.
Strategies with the paper's recipe (their defaults): ags is Algorithm 1 literally, ags-ns
is AGS-NS (README: AdaScale's gain exponent 1); ags-ns p=1/2, an ablation, is AGS-NS with
the paper's exponent 1/2 (AGS-NS's recipe before). "<strategy> tuned": its tuned
configuration (below), {len(r['tuned'])} of {len(STRATEGY_RUNS)} strategies tuned so far.
Runs of a label's current recipe version are reused across sessions and commits (the
baselines' code is unchanged since they were recorded); wall times depend on the machine's
load when each run was recorded.

{table}

{chr(10).join('- ' + n for n in notes)}

{_tuned_markdown(r)}
{_goals_markdown(r["goals"])}

{_shortfalls_markdown(r["shortfalls"])}

Fig. 7 analog: where AGS's steps fall against each run's gate delta (eq. 5 per step, all
seeds and epochs; a step left of its gate is scaled; the paper's delta is {r['delta']}, ags-ns
has no gate, a tuned run has its tuned delta). The legend gives each label's share of
scaled steps as its optimizer counted them.

![variability of AGS steps](benchmarks/results/{r['variability_plot']})
"""


def _tuned_markdown(r: dict) -> str:
    if not r["tuned"]:
        return "No strategy tuned yet."
    table = markdown_table(
        ["strategy", "trials", "lr (base)", "options", "validation accuracy",
         "tuning wall (min)"],
        [[t["label"], f"{t['trials']} ({t['trials_run']} run)", f"{t['lr']:.4g}",
          json.dumps(t["strategy_options"], sort_keys=True) if t["strategy_options"] else "",
          f"{t['val_accuracy']:.2%}", f"{t['wall_s'] / 60:.0f}"] for t in r["tuned"]])
    return f"""Tuned configurations (`benchmarks.tuning`): each strategy tuned once at N =
{r['world_size']}, B = {r['tuning']['global_batch']} with `tula_ray.tune_training` (Optuna TPE +
ASHA on Ray Tune, {r['epochs']} epochs, judged on 20 % of the training subset held out; the
test set untouched), the same trial budget each, and carried to the other B unchanged: lr
is the rate before each strategy's own rule (lrs and lars scale it by B / 128; lbt and polo
keep it; the AGS variants keep it and scale the gradient, by at most s_max).

{table}
"""
