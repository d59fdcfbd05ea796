"""Issue 24's last goal: the demo's profiling wall no more than 10 % above what it was
before the issue changed how a step is timed (one data path, alternating blocks, warm-up
by time, the evaluation, checkpoint and strategy phases). Measured side by side: the
demo as a user types it (`tula-ray demo`, its own local Ray) from this tree and from a
checkout of the baseline commit, runs interleaved, the order alternating, so that the
machine's drift (NOTES-ENV: ~15 % between processes) falls on both alike.

Every run is appended to profiling_wall.runs.jsonl as it ends: a session that stops
mid-run resumes from the runs recorded at the same two commits. `--quick` runs this tree
once on a tiny grid (N = 1, B <= 64): a smoke test of the plumbing, no baseline.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from benchmarks.common import RESULTS_DIR, provenance, write_result
from benchmarks.markdown import markdown_table

NAME = "profiling_wall"
# The last commit before issue 24's data path and step timing (db765aa and after).
BASELINE = "ee46365"
RUNS = 2  # per tree
GOAL_RATIO = 1.10
REPO = Path(__file__).parents[1]


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


def demo(tree: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """One `tula-ray demo` from `tree` (its packages first on the path of the driver and,
    through the environment Ray's workers inherit, of every worker): the plan's walls."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tula_ray.cli", "demo", "--out", str(out),
                    "--storage-path", str(out / "ray"), *extra], cwd=tree, check=True,
                   env={**_environment(), "PYTHONPATH": str(tree)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    meta = json.loads((out / "plan.json").read_text())["meta"]
    return {"wall_s": wall, "profiling_wall_s": meta["profiling_wall_s"],
            "probe_wall_s": meta["probe_wall_s"], "launches": meta["launches"],
            "sweeps_s": [round(s["wall_s"], 2) for s in meta.get("sweeps", [])]}


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _recorded(path: Path, commits: dict[str, str]) -> list[dict[str, Any]]:
    """The runs already recorded at these two commits (a resumed benchmark's)."""
    if not path.exists():
        return []
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in runs if r["commits"] == commits]


def run(quick: bool = False, baseline: str = BASELINE, runs: int = RUNS) -> dict:
    head = commit_of(REPO)
    commits = {"baseline": head if quick else commit_of(REPO, baseline), "this": head}
    log = RESULTS_DIR / f"{NAME}{'_quick' if quick else ''}.runs.jsonl"
    if quick:
        log.unlink(missing_ok=True)
    recorded = _recorded(log, commits)
    extra = ["--cluster-sizes", "1", "--max-batch", "64"] if quick else []
    order = [("this",)] if quick else [
        ("baseline", "this") if i % 2 == 0 else ("this", "baseline") for i in range(runs)]
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        trees = {"this": REPO}
        for index, pair in enumerate(order):
            for tree in pair:
                if any(r["index"] == index and r["tree"] == tree for r in recorded):
                    continue  # recorded by an earlier session
                if tree not in trees:
                    trees[tree] = stack.enter_context(checkout(commits[tree]))
                row = {"commits": commits, "index": index, "tree": tree,
                       **demo(trees[tree], Path(scratch, f"{tree}-{index}"), extra)}
                recorded.append(row)
                with log.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                print(row, flush=True)
    result = {"provenance": provenance(), "quick": quick, "commits": commits,
              "runs": recorded, **summary(recorded)}
    markdown = report(result)
    write_result(NAME + ("_quick" if quick else ""), result, markdown)
    print(markdown)
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median profiling wall per tree, its spread, and this tree's over the baseline's."""
    walls = {tree: [r["profiling_wall_s"] for r in runs if r["tree"] == tree]
             for tree in ("baseline", "this")}
    medians = {tree: statistics.median(w) if w else None for tree, w in walls.items()}
    spreads = {tree: (max(w) - min(w)) / statistics.median(w) if len(w) > 1 else None
               for tree, w in walls.items()}
    ratio = (medians["this"] / medians["baseline"]
             if medians["this"] and medians["baseline"] else None)
    return {"median_profiling_wall_s": medians, "spread": spreads, "ratio": ratio,
            "goal_met": None if ratio is None else ratio <= GOAL_RATIO}


def report(result: dict) -> str:
    p = result["provenance"]
    body = [[r["index"], r["tree"], result["commits"][r["tree"]], f"{r['wall_s']:.0f}",
             f"{r['probe_wall_s']:.1f}", f"{r['profiling_wall_s']:.1f}", r["launches"],
             ", ".join(f"{s:.1f}" for s in r["sweeps_s"])]
            for r in sorted(result["runs"], key=lambda r: (r["index"], r["tree"]))]
    medians, spreads = result["median_profiling_wall_s"], result["spread"]

    def figure(tree: str) -> str:
        if medians[tree] is None:
            return "-"
        spread = "" if spreads[tree] is None else f" (spread {spreads[tree]:.0%})"
        return f"{medians[tree]:.1f} s{spread}"

    ratio = result["ratio"]
    verdict = "-" if ratio is None else (f"{ratio:.2f} (goal <= {GOAL_RATIO:.2f}: "
                                         f"{'met' if result['goal_met'] else 'missed'})")
    return "\n".join([
        "### The demo's profiling wall, before and after issue 24's timing (side by side)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        "Each run is `tula-ray demo` as a user types it (its own local Ray), from this tree "
        "and from a checkout of the baseline commit, interleaved; profiling wall = the "
        "plan's `meta.profiling_wall_s` (launches and their batches; Ray's start and the "
        "memory probe excluded).\n",
        markdown_table(["run", "tree", "commit", "wall s", "probe s", "profiling wall s",
                        "launches", "per launch s"], body),
        "",
        f"- Median profiling wall: baseline {figure('baseline')}, this tree {figure('this')}.",
        f"- This tree / baseline: {verdict}.",
    ]) + "\n"
