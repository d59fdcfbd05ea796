"""Issue 11 figures for `tula-ray demo`: its profiling wall time, and whether runs in a row
choose the same candidate (or name the tie they broke), for each search strategy the
demo could use. Each run is the command a user types (a subprocess with its own local
Ray), one after the other on an otherwise idle machine.

The model's accuracy and the strategies' regret on the same grid are in
`benchmarks/prediction/prediction.py`; this is what a user of the demo sees.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import Benchmark, markdown_table

NAME = "search_cost"
DEMO_MAX_BATCH = 2048  # the demo's default upper bound
STRATEGIES = ("partial", "adaptive")  # the candidates for the demo's default
RUNS = 3
GOAL_PROFILING_S = 60.0  # issue 11: demo profiling wall time on this machine


DEMO_LOG = "demo.log"  # a demo's output, beside its plan.json


def time_demo(strategy: str, out: Path, storage: Path, max_batch: int = DEMO_MAX_BATCH, *,
              extra: tuple[str, ...] = (), tree: Path | None = None) -> float:
    """Wall time of one `tula-ray demo` (Ray start and probe included), as a user runs it;
    what it printed is kept in out/DEMO_LOG (stdout, then stderr).
    tree: run the code of this source tree instead (its packages first on the path of the
    driver and, through the environment Ray's workers inherit, of every worker)."""
    environment = None
    if tree is not None:
        environment = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                       "PYTHONPATH": str(tree)}
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tula_ray.cli", "demo", "--max-batch", str(max_batch),
         "--search-strategy", strategy, "--out", str(out), "--storage-path", str(storage),
         *extra], cwd=tree, env=environment, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    (out / DEMO_LOG).write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"tula-ray demo exited with {done.returncode}:\n"
                           f"{done.stderr[-4000:]}")
    return wall_s


def summarise(plan, wall_s: float | None) -> dict:
    """What one demo run cost and chose, from its plan."""
    meta, choice = plan.meta, plan.choice
    return {"wall_s": wall_s, "probe_wall_s": meta["probe_wall_s"],
            "profiling_wall_s": meta["profiling_wall_s"], "launches": meta["launches"],
            "candidates": meta["candidates_profiled"], "rounds": meta["rounds"],
            "stop_reason": meta.get("stop_reason", ""),
            "choice": [choice.num_workers, choice.global_batch],
            "ties": [list(t) for t in choice.ties], "tie_break": choice.tie_break,
            "reason": choice.reason}


def consistency(runs: list[dict]) -> dict:
    """Same choice in every run, or every run whose choice differs names a tie."""
    choices = Counter(tuple(r["choice"]) for r in runs)
    same = len(choices) == 1
    named = all(r["ties"] for r in runs)
    # A differing choice is explained when each run's choice is among the others' ties.
    covered = all(tuple(other["choice"]) == tuple(run["choice"])
                  or list(other["choice"]) in run["ties"] for run in runs for other in runs)
    return {"same_choice": same, "choices": {f"N={n}, B={b}": k for (n, b), k in choices.items()},
            "every_run_names_its_tie": named, "differences_named_as_ties": covered,
            "goal_met": same or covered}


def run(quick: bool = False, plans: dict | None = None) -> dict:
    """plans: {strategy: [Plan, ...]} of searches already run, summarised instead of running
    the demo (quick only: the test suite hands in its own); nothing is timed then."""
    from tula_ray.planning.plan import Plan

    if plans and not quick:
        raise ValueError("plans is for quick runs only; a full run times its own demos")
    load_before = os.getloadavg()[0]
    results = {}
    if plans is not None:
        results = {s: [summarise(p, None) for p in ps] for s, ps in plans.items()}
    else:
        max_batch = 64 if quick else DEMO_MAX_BATCH
        with tempfile.TemporaryDirectory() as scratch:
            for strategy in STRATEGIES[:1] if quick else STRATEGIES:
                results[strategy] = []
                for i in range(1 if quick else RUNS):
                    out = Path(scratch, f"{strategy}-{i}")
                    wall = time_demo(strategy, out, Path(scratch, "ray"), max_batch)
                    results[strategy].append(summarise(Plan.from_json(out / "plan.json"), wall))
    return Benchmark(NAME, quick).record(
        {"quick": quick, "load_avg_1min": [load_before, os.getloadavg()[0]], "runs": results,
         "consistency": {s: consistency(r) for s, r in results.items()},
         "goal_profiling_s": GOAL_PROFILING_S}, report)


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def report(r: dict) -> str:
    rows = []
    for strategy, runs in r["runs"].items():
        for i, x in enumerate(runs, 1):
            ties = ", ".join(f"N={n}, B={b}" for n, b in x["ties"]) or "none"
            rows.append([strategy, i, _seconds(x["wall_s"]), _seconds(x["probe_wall_s"]),
                         _seconds(x["profiling_wall_s"]),
                         f"{x['launches']} / {x['candidates']} / {x['rounds']}",
                         f"N={x['choice'][0]}, B={x['choice'][1]}", ties])
    runs = markdown_table(["strategy", "run", "wall (s)", "probe (s)", "profiling (s)",
                           "launches / candidates / rounds", "choice", "ties named"], rows)
    verdicts = markdown_table(
        ["strategy", "same choice every run", "a differing choice is among the ties named",
         "goal met"],
        [[s, f"{'yes' if c['same_choice'] else 'no'} "
             f"({', '.join(f'{k}: {v}x' for k, v in c['choices'].items())})",
          "yes" if c["differences_named_as_ties"] else "no",
          "yes" if c["goal_met"] else "**no**"] for s, c in r["consistency"].items()])
    load = r["load_avg_1min"]
    return f"""### `tula-ray demo`: wall time and repeatability per search strategy (issue 11)

`{r['command']}` — commit {r['commit']}, {r['date']}, {r['machine']}; 1-min load average
{load[0]:.1f} before, {load[1]:.1f} after.

Each run is `tula-ray demo --search-strategy S` as a user types it (its own local Ray),
the runs one after another. Goal: profiling wall time <= {r['goal_profiling_s']:.0f} s (the
probe and Ray's start excluded); runs in a row choose the same candidate, or each names
the tie it broke.

{runs}

{verdicts}
"""
