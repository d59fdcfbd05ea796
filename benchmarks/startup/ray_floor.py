"""python -m benchmarks ray-floor (issue 40, item 4): how low the demo's start-up can go
while it keeps its launches, its Ray start and its dashboard, as the issue asks.

The goal compares the time the demo spends outside its timed steps and the memory probe
with the baseline's (03a9521): at most half. Part of that time is Ray's own, whatever
tula-ray does: the driver's imports of Ray and torch, Ray's start with the dashboard, and
for each of the demo's two launches (N = 1 and N = 2) the chain of processes Ray Tune and
Ray Train start and end (the trial's actor, the controller, the workers, their process
group), each one importing torch. This benchmark runs that part alone
(`ray_floor_runner.py`: the same launches, their functions only reporting, one per
candidate) beside the baseline's demo, interleaved, and sets the floor's wall against the
baseline's outside time.
If the floor is above half of it, the goal cannot be met by any change to tula-ray's own
steps: it would take fewer processes per launch than Ray Tune and Ray Train start.

Protocol (fixed here before the first run): `RUNS` rounds, each one floor run (a fresh
process, this tree) and one `tula-ray demo` of the baseline (`demo_startup.demo`), the
order alternating; the medians over the rounds, with [min, max]; every run appended to
ray_floor.runs.jsonl as it ends (a session that stops mid-run resumes from it).
--quick: one floor run of one launch of one worker reporting once, no baseline.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import markdown_table
from benchmarks.startup.demo_startup import (BASELINE, GOAL_OUTSIDE_RATIO,
                                              child_environment, demo)
from benchmarks.startup.profiling_wall import REPO, commit_of, side_by_side

NAME = "ray_floor"
RUNS = 5
RUNNER = Path(__file__).with_name("ray_floor_runner.py")
SIZES, REPORTS = "1,2", 3  # the demo's launches: N in {1, 2}, 3 candidates each
QUICK_SIZES, QUICK_REPORTS = "1", 1
FLOOR_PARTS = ("imports_s", "ray_start_s", "tune_s", "ray_end_s", "other_s")


def floor(out: Path, sizes: str, reports: int) -> dict[str, float]:
    """One run of `ray_floor_runner.py` in a fresh process: its wall and its parts."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(RUNNER), str(out), sizes, str(reports)],
                          cwd=REPO, env={**child_environment(), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"the floor run failed:\n{done.stderr[-3000:]}")
    inside = json.loads((out / "floor.json").read_text())
    parts = {part: inside[part] for part in FLOOR_PARTS if part in inside}
    parts["other_s"] = wall_s - sum(parts.values())
    return {"wall_s": wall_s, **parts}


def run_one(tree: Path, out: Path, quick: bool) -> dict[str, Any]:
    """This tree: the floor; the baseline's checkout: its demo, as demo-startup runs it."""
    if tree == REPO:
        return floor(out, *((QUICK_SIZES, QUICK_REPORTS) if quick else (SIZES, REPORTS)))
    return demo(tree, out, ())


def run(quick: bool = False, runs: int = RUNS) -> dict:
    commits = {"this": commit_of(REPO)}
    if not quick:
        commits["baseline"] = commit_of(REPO, BASELINE)
    return side_by_side(NAME, commits, runs, quick, None,
                        lambda tree, out: run_one(tree, out, quick),
                        show=lambda row: print({k: v for k, v in row.items()
                                                if k != "commits"}, flush=True),
                        summarize=summary, report=report)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The floor's parts and wall, the baseline's outside time and wall, each with its
    spread; the floor over the baseline's outside time, against the goal's ratio."""
    floors = [r for r in runs if r["tree"] == "this"]
    baselines = [r for r in runs if r["tree"] == "baseline"]
    result: dict[str, Any] = {
        "floor": {part: _spread([r[part] for r in floors])
                  for part in (*FLOOR_PARTS, "wall_s")},
        "baseline": {part: _spread([r[part] for r in baselines])
                     for part in ("outside_s", "wall_s")} if baselines else {},
        "floor_ratio": None, "goal_reachable": None}
    if baselines:
        ratio = (result["floor"]["wall_s"]["median"]
                 / result["baseline"]["outside_s"]["median"])
        result.update(floor_ratio=ratio, goal_reachable=ratio <= GOAL_OUTSIDE_RATIO)
    return result


def _cell(spread: dict[str, float]) -> str:
    return f"{spread['median']:.1f} [{spread['min']:.1f}, {spread['max']:.1f}]"


def report(result: dict) -> str:
    p = result["provenance"]
    sizes, reports = (QUICK_SIZES, QUICK_REPORTS) if result["quick"] else (SIZES, REPORTS)
    rows = [[f"floor: {part.removesuffix('_s').replace('_', ' ')}", _cell(spread)]
            for part, spread in result["floor"].items()]
    rows += [[f"baseline demo ({result['commits']['baseline']}): "
              f"{part.removesuffix('_s')}", _cell(spread)]
             for part, spread in result["baseline"].items()]
    lines = [
        "### Ray's floor under the demo's start-up (issue 40, item 4)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        "The floor is one fresh driver that imports Ray and torch, starts tula-ray's local "
        "Ray (the dashboard on), runs the demo's launches through Ray Tune and Ray Train "
        f"(N in {{{sizes}}}, each worker function making only {reports} report(s): no model, "
        "no data, no step) and shuts Ray down "
        "(`benchmarks/startup/ray_floor_runner.py`); a full run interleaves it with the "
        "baseline's `tula-ray demo`. Seconds, median [min, max] over the rounds.\n",
        markdown_table(["part", "s"], rows), ""]
    if result["floor_ratio"] is not None:
        allowed = GOAL_OUTSIDE_RATIO * result["baseline"]["outside_s"]["median"]
        lines.append(
            f"- The floor over the baseline's outside time: {result['floor_ratio']:.2f}; the "
            f"goal allows {GOAL_OUTSIDE_RATIO} ({allowed:.1f} s): "
            + ("reachable, as far as Ray's part goes." if result["goal_reachable"] else
               "out of reach while the demo keeps its launches, its Ray start and its "
               "dashboard, even if tula-ray's own steps took no time."))
    return "\n".join(lines) + "\n"
