"""What `tula-ray demo` prints by default (issue 41, item 5): its lines and its widest line.

One `tula-ray demo` as a user types it (the installed command, its own local Ray, the
dashboard on), in an empty directory, its stdout and stderr read together as a terminal
shows them. Goal: at most GOAL_LINES lines, the plan included, none wider than
GOAL_WIDTH characters. The lines a Ray process prints itself (its `(... pid=...)` prefix)
are counted too, and also apart. `--quick`: the demo of one candidate (N=1, B=32), about a
minute; the full run is the demo's default grid (2 N x 3 B profiled), about 2.5 minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Benchmark, markdown_table
from benchmarks.startup.demo_startup import QUICK_ARGS

NAME = "demo_output"
GOAL_LINES = 40  # the issue's: the whole output, the plan included
GOAL_WIDTH = 100  # characters
TIMEOUT_S = 900
RAY_PREFIX = "pid="  # in the prefix of a line a Ray process printed, e.g. (RayTrainWorker pid=1)


def demo_command() -> list[str]:
    """`tula-ray` beside this Python (the installed console script), else its module."""
    script = Path(sys.executable).with_name("tula-ray")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tula_ray.cli"]


def measure(printed: str) -> dict[str, Any]:
    """Lines, the widest, how many are wider than the goal, and Ray's own lines."""
    lines = printed.splitlines()
    widest = max(lines, key=len, default="")
    return {"lines": len(lines), "widest": len(widest), "widest_line": widest,
            "lines_over_width": sum(1 for line in lines if len(line) > GOAL_WIDTH),
            "ray_process_lines": sum(1 for line in lines if RAY_PREFIX in line)}


def run_demo(demo_args: tuple[str, ...]) -> dict[str, Any]:
    """One demo in an empty directory, its own Ray (RAY_ADDRESS unset); what it printed."""
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory(prefix="tula-demo-output-") as scratch:
        started = time.perf_counter()
        done = subprocess.run([*demo_command(), "demo", "--storage-path",
                               str(Path(scratch, "ray_results")), *demo_args],
                              cwd=scratch, env=environment, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
        wall_s = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"tula-ray demo failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return {"demo_args": list(demo_args), "wall_s": wall_s, "printed": done.stdout,
            **measure(done.stdout)}


def run(quick: bool = False) -> dict:
    measured = run_demo(QUICK_ARGS if quick else ())
    measured["goal_met"] = measured["lines"] <= GOAL_LINES and measured["widest"] <= GOAL_WIDTH
    return Benchmark(NAME, quick).record(measured, report)


def report(result: dict) -> str:
    p = result  # provenance() is the result's first keys
    args = " ".join(result["demo_args"]) or "(its defaults)"
    rows = [["lines", result["lines"], f"<= {GOAL_LINES}"],
            ["widest line (characters)", result["widest"], f"<= {GOAL_WIDTH}"],
            ["lines wider than the goal", result["lines_over_width"], "0"],
            ["lines a Ray process printed itself", result["ray_process_lines"], ""]]
    return "\n".join([
        "### What the demo prints by default (issue 41, item 5)\n",
        f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
        f"`tula-ray demo {args}` in an empty directory, its own local Ray, stdout and stderr "
        f"together ({result['wall_s']:.0f} s).\n",
        markdown_table(["figure", "measured", "goal"], rows), "",
        f"- Goal {'met' if result['goal_met'] else 'missed'}.",
        "", "```text", result["printed"].rstrip(), "```", ""])
