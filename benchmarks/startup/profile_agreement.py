"""The profiles of this tree against BASELINE's, side by side (issue 42, step 3: the
measuring steps moved out of the Ray layer, behaviour unchanged): the same demo, run
from each tree, must measure the same step times within the runs' own spread.

Each run is `tula-ray demo` as a user types it (its own local Ray), a full search of a
small grid (GRID: every candidate profiled, both cluster sizes), from this tree or from
a checkout of BASELINE, RUNS of each interleaved with the order rotating
(`profiling_wall.side_by_side`), so that the machine's drift (NOTES-ENV: ~15 % between
processes) falls on both trees alike. Per (N, B) and tree: the median over the runs of
the profiled step time and its compute part, and their spread (min to max); the trees
agree at (N, B) when their medians differ by no more than the wider of the two spreads.

Every run is appended to profile_agreement.runs.jsonl as it ends: a session that stops
mid-run resumes from the runs recorded at the same commits. `--quick` runs each tree
once on a tiny grid (N = 1, B = 32): a smoke test of the plumbing, no verdict.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table
from benchmarks.prediction.search_cost import time_demo
from benchmarks.startup.profiling_wall import REPO, commit_of, side_by_side, walls
from tula_ray.planning.plan import Plan
from tula_ray.profile_table import STATUS_OK

NAME = "profile_agreement"
# The last commit with the measuring steps in the Ray layer (trainables/profiling_sweep.py).
BASELINE = "dec29af"
RUNS = 3  # per tree
# The demo's search: every candidate of N in {1, 2} and B in {32, ..., 256} (min batch 32,
# the demo's), two worker groups per run.
STRATEGY = "full"
GRID = {"max_batch": 256, "extra": ("--cluster-sizes", "1", "2")}
QUICK_GRID = {"max_batch": 32, "extra": ("--cluster-sizes", "1")}
# What is compared, per (N, B): the profiled step, and its compute part.
METRICS = ("step_time_s", "compute_time_s")


def profiled(tree: Path, out: Path, grid: dict[str, Any]) -> dict[str, Any]:
    """One demo from `tree`: its walls and every measured row's step times."""
    wall = time_demo(STRATEGY, out, out / "ray", grid["max_batch"], extra=grid["extra"],
                     tree=tree)
    profiles = Plan.from_json(out / "plan.json").profiles
    rows = [{"num_workers": int(row["num_workers"]), "global_batch": int(row["global_batch"]),
             **{metric: float(row[metric]) for metric in METRICS}}
            for _, row in profiles.iterrows() if row["status"] == STATUS_OK]
    return {**walls(out, wall), "rows": rows}


def run(quick: bool = False, baseline: str = BASELINE, runs: int = RUNS) -> dict:
    """RUNS demos from each tree, interleaved (one each with `quick`, on QUICK_GRID)."""
    commits = {"this": commit_of(REPO), baseline: commit_of(REPO, baseline)}
    grid = QUICK_GRID if quick else GRID
    return side_by_side(NAME, commits, runs, quick, None,
                        lambda tree, out: profiled(tree, out, grid),
                        show=lambda row: print({k: v for k, v in row.items() if k != "rows"},
                                               flush=True),
                        summarize=summary, report=report)


def spread_of(values: list[float]) -> dict[str, Any]:
    """The median of one tree's runs and their range."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


def agree(this: dict[str, Any], other: dict[str, Any]) -> bool | None:
    """Whether two trees' medians differ by no more than the wider of their spreads
    (max - min); None with fewer than two runs of either (no spread to judge by)."""
    if this["runs"] < 2 or other["runs"] < 2:
        return None
    width = max(this["max"] - this["min"], other["max"] - other["min"])
    return abs(this["median"] - other["median"]) <= width


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (N, B): each tree's median and range of each metric, and whether they agree;
    the (N, B) only one tree measured, and whether every compared one agrees."""
    values: dict[tuple[int, int], dict[str, dict[str, list[float]]]] = {}
    for r in runs:
        for row in r["rows"]:
            per_tree = values.setdefault((row["num_workers"], row["global_batch"]), {})
            for metric in METRICS:
                per_tree.setdefault(r["tree"], {}).setdefault(metric, []).append(row[metric])
    trees = sorted({r["tree"] for r in runs}, key=lambda tree: tree != "this")
    candidates, only_one = [], []
    for (n, b), per_tree in sorted(values.items()):
        if len(trees) < 2 or set(per_tree) != set(trees):
            only_one.append([n, b])
            continue
        figures = {metric: {tree: spread_of(per_tree[tree][metric]) for tree in trees}
                   for metric in METRICS}
        candidates.append({"num_workers": n, "global_batch": b, **figures, "agree": {
            metric: agree(*(figures[metric][tree] for tree in trees)) for metric in METRICS}})
    verdicts = [c["agree"][metric] for c in candidates for metric in METRICS]
    return {"trees": trees, "candidates": candidates, "only_one_tree": only_one,
            "all_agree": None if not verdicts or None in verdicts else all(verdicts)}


def report(result: dict) -> str:
    p, trees = result["provenance"], result["trees"]

    def figure(f: dict[str, Any]) -> str:
        return f"{f['median'] * 1e3:.1f} ({f['min'] * 1e3:.1f}-{f['max'] * 1e3:.1f})"

    def verdict(agreed: bool | None) -> str:
        return "n/a" if agreed is None else "yes" if agreed else "no"

    header = ["N", "B"]
    for metric in METRICS:
        header += [f"{metric[:-2]} ms, {tree} ({result['commits'][tree]})" for tree in trees]
        header.append("agree")
    body = [[c["num_workers"], c["global_batch"],
             *(cell for metric in METRICS for cell in (
                 *(figure(c[metric][tree]) for tree in trees), verdict(c["agree"][metric])))]
            for c in result["candidates"]]
    only = ", ".join(f"N={n} B={b}" for n, b in result["only_one_tree"]) or "none"
    return "\n".join([
        "### Profiles of this tree against the baseline's, side by side (issue 42, step 3)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        f"Each run is `tula-ray demo --search-strategy {STRATEGY}` as a user types it (its "
        "own local Ray), from this tree and from a checkout of the baseline, interleaved. "
        "Per (N, B): the median over the runs of the profiled step and its compute part, "
        "in ms, with their range (min-max); the trees agree when the medians differ by no "
        "more than the wider range.\n",
        markdown_table(header, body),
        "",
        f"- Runs: {len(result['runs'])}; measured by one tree only: {only}.",
        f"- Every (N, B) agrees within the runs' spread: {verdict(result['all_agree'])}.",
    ]) + "\n"
