"""The demo's profiling wall, this tree against earlier commits, side by side:
  - issue 24's goal: no more than 10 % above the wall before the issue changed how a step
    is timed (one data path, alternating blocks, warm-up by time, the evaluation,
    checkpoint and strategy phases): `BASELINES[1]` against `BASELINES[0]`;
  - issue 25's: the gradient-noise phase may add at most 25 %: `BASELINES[2]` against
    `BASELINES[1]`, the last commit without it;
  - partial search's middle batch and 3 timed steps at least, not 5 (issue 24 again):
    this tree against `BASELINES[2]`, the last commit without either; issue 24's whole
    cost is the product of its two ratios.
Each run is the demo as a user types it (`tula-ray demo`, its own local Ray), from this
tree or from a checkout of a commit, runs interleaved with the order rotating, so that
the machine's drift (NOTES-ENV: ~15 % between processes) falls on every tree alike.

Every run is appended to profiling_wall.runs.jsonl as it ends: a session that stops
mid-run resumes from the runs recorded at the same commits. `--quick` runs this tree
once on a tiny grid (N = 1, B = 32): a smoke test of the plumbing, no baseline.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.common import Benchmark, markdown_table
from benchmarks.prediction.search_cost import DEMO_MAX_BATCH, time_demo

NAME = "profiling_wall"
# The last commit before issue 24's data path and step timing (db765aa and after), the
# last before issue 25's gradient-noise phase, and the last before partial search's middle.
BASELINES = ("ee46365", "c6185ee", "eba74cc")
RUNS = 2  # per tree
GOALS = {("c6185ee", "ee46365"): ("issue 24: its timing", 1.10),
         ("eba74cc", "c6185ee"): ("issue 25: the gradient-noise phase", 1.25),
         ("this", "eba74cc"): ("issue 24: partial search's middle batch, 3 timed steps",
                               None)}
# Issue 24's goal is on its whole cost: the product of these ratios.
PRODUCTS = {"issue 24: its timing, the middle batch and 3 timed steps, together":
            ((("c6185ee", "ee46365"), ("this", "eba74cc")), 1.10)}
REPO = Path(__file__).parents[2]


def commit_of(tree: Path, ref: str = "HEAD") -> str:
    return subprocess.run(["git", "rev-parse", "--short", ref], cwd=tree, check=True,
                          capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def checkout(commit: str) -> Iterator[Path]:
    """A detached git worktree of `commit` in a scratch directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="tula-baseline-") as scratch:
        tree = Path(scratch, "tree")
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO,
                       check=True, capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO,
                           capture_output=True)


def demo(tree: Path, out: Path, max_batch: int, extra: tuple[str, ...]) -> dict[str, Any]:
    """One default `tula-ray demo` (partial search) from `tree`: the plan's walls."""
    return walls(out, time_demo("partial", out, out / "ray", max_batch, extra=extra, tree=tree))


def walls(out: Path, wall: float) -> dict[str, Any]:
    """A demo's walls: the whole command's, and its plan's (in `out`)."""
    meta = json.loads((out / "plan.json").read_text())["meta"]
    return {"wall_s": wall, "profiling_wall_s": meta["profiling_wall_s"],
            "probe_wall_s": meta["probe_wall_s"], "launches": meta["launches"],
            "sweeps_s": [round(s["wall_s"], 2) for s in meta.get("sweeps", [])]}


def recorded_runs(path: Path, commits: dict[str, str]) -> list[dict[str, Any]]:
    """The runs already recorded at these commits (a resumed benchmark's)."""
    if not path.exists():
        return []
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in runs if r["commits"] == commits]


def side_by_side(name: str, commits: dict[str, str], runs: int, quick: bool,
                 ran: dict[str, Any] | None, run_one: Callable[[Path, Path], dict[str, Any]],
                 show: Callable[[dict[str, Any]], None],
                 summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
                 report: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """Every run of the benchmark `name` (`interleaved`), resumed from its log
    (results/NAME.runs.jsonl); --quick: one run, or the one a test already ran (`ran`).
    Writes and prints the result (the runs and their `summarize`), `report` its markdown."""
    benchmark = Benchmark(name, quick)
    log = benchmark.log()
    recorded = recorded_runs(log, commits)
    if quick and ran is not None:
        recorded = [{"commits": commits, "index": 0, "tree": "this", **ran}]
    interleaved(commits, 1 if quick else runs, recorded, log, run_one, show)
    return benchmark.record({"quick": quick, "commits": commits, "runs": recorded,
                             **summarize(recorded)}, report, nested=True)


def interleaved(commits: dict[str, str], runs: int, recorded: list[dict[str, Any]], log: Path,
                run_one: Callable[[Path, Path], dict[str, Any]],
                show: Callable[[dict[str, Any]], None]) -> None:
    """`runs` rounds of `run_one(tree, out)` over the trees of `commits` ("this": the working
    tree, others checked out), each round starting with the next tree (none is always first,
    on a fresh machine, or last). A run `recorded` holds (an earlier session's) is skipped;
    each new row is appended to `recorded` and to `log` as it ends, then shown."""
    names = list(commits)
    order = [names[i % len(names):] + names[:i % len(names)] for i in range(runs)]
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        trees: dict[str, Path] = {"this": REPO}
        for index, pair in enumerate(order):
            for tree in pair:
                if any(r["index"] == index and r["tree"] == tree for r in recorded):
                    continue  # recorded by an earlier session
                if tree not in trees:
                    trees[tree] = stack.enter_context(checkout(commits[tree]))
                row = {"commits": commits, "index": index, "tree": tree,
                       **run_one(trees[tree], Path(scratch, f"{tree}-{index}"))}
                recorded.append(row)
                with log.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                show(row)


def run(quick: bool = False, baselines: tuple[str, ...] = BASELINES, runs: int = RUNS,
        ran: dict[str, Any] | None = None) -> dict:
    """ran: with quick, the walls (`walls`) of a demo of this tree already run, reported
    instead of running one (the CLI's test runs the demo, as a user types it)."""
    commits = {"this": commit_of(REPO)}
    if not quick:
        commits.update({commit_of(REPO, ref): commit_of(REPO, ref) for ref in baselines})
    max_batch, extra = (32, ("--cluster-sizes", "1")) if quick else (DEMO_MAX_BATCH, ())
    return side_by_side(NAME, commits, runs, quick, ran,
                        lambda tree, out: demo(tree, out, max_batch, extra),
                        show=lambda row: print(row, flush=True), summarize=summary,
                        report=report)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median profiling wall per tree, its spread, and the ratios the goals name."""
    walls: dict[str, list[float]] = {}
    for r in runs:
        walls.setdefault(r["tree"], []).append(r["profiling_wall_s"])
    medians = {tree: statistics.median(w) for tree, w in walls.items()}
    spreads = {tree: (max(w) - min(w)) / statistics.median(w) if len(w) > 1 else None
               for tree, w in walls.items()}
    goals, ratios = [], {}
    for (new, old), (what, limit) in GOALS.items():
        if new in medians and old in medians:
            ratios[(new, old)] = ratio = medians[new] / medians[old]
            goals.append({"goal": what, "new": new, "old": old, "ratio": ratio,
                          "limit": limit, "met": None if limit is None else ratio <= limit})
    for what, (factors, limit) in PRODUCTS.items():
        if all(f in ratios for f in factors):
            ratio = math.prod(ratios[f] for f in factors)
            goals.append({"goal": what, "new": " x ".join(f"{n} / {o}" for n, o in factors),
                          "old": None, "ratio": ratio, "limit": limit, "met": ratio <= limit})
    return {"median_profiling_wall_s": medians, "spread": spreads, "goals": goals}


def report(result: dict) -> str:
    p = result["provenance"]
    body = [[r["index"], r["tree"], result["commits"][r["tree"]], f"{r['wall_s']:.0f}",
             f"{r['probe_wall_s']:.1f}", f"{r['profiling_wall_s']:.1f}", r["launches"],
             ", ".join(f"{s:.1f}" for s in r["sweeps_s"])]
            for r in sorted(result["runs"], key=lambda r: (r["index"], r["tree"]))]
    medians, spreads = result["median_profiling_wall_s"], result["spread"]

    def figure(tree: str) -> str:
        spread = "" if spreads[tree] is None else f" (spread {spreads[tree]:.0%})"
        return f"{tree} ({result['commits'][tree]}) {medians[tree]:.1f} s{spread}"

    def verdict(g: dict) -> str:
        named = g["new"] if g["old"] is None else f"{g['new']} / {g['old']}"
        judged = "" if g["limit"] is None else \
            f" (goal <= {g['limit']:.2f}: {'met' if g['met'] else 'missed'})"
        return f"- {g['goal']}: {named} = {g['ratio']:.2f}{judged}."

    verdicts = [verdict(g) for g in result["goals"]]
    return "\n".join([
        "### The demo's profiling wall, before and after issues 24 and 25 (side by side)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        "Each run is `tula-ray demo` as a user types it (its own local Ray), from this tree "
        "and from checkouts of earlier commits, interleaved; profiling wall = the plan's "
        "`meta.profiling_wall_s` (launches and their batches; Ray's start and the memory "
        "probe excluded).\n",
        markdown_table(["run", "tree", "commit", "wall s", "probe s", "profiling wall s",
                        "launches", "per launch s"], body),
        "",
        "- Median profiling wall: " + "; ".join(figure(tree) for tree in medians) + ".",
        *verdicts,
    ]) + "\n"
