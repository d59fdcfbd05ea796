"""Issue 22 figures: what a new user meets first, each run as the user runs it (a fresh
process, its own local Ray), one after the other on an otherwise idle machine.

  fresh clone      README's main command, exactly as README gives it, in a fresh clone of
                   this repository's HEAD with an empty home directory and without the
                   Debian package dataset-fashion-mnist (hidden in a private mount
                   namespace where it is installed): does it end with a plan, where did
                   the data come from, how long did it take (install included)?
  no means         `tula-ray demo` where the data are nowhere and no network answers (a
                   network namespace without routes): seconds until it stops, and what
                   it says (goal: within 10 s, with what to do).
  driver-only data `tula_ray.search()` on a Workload whose dataset the driver reads and the
                   workers cannot (FileNotFoundError in any other process), grid B = 32-256:
                   seconds from the call until it raises, and whether the exception names
                   the cause (goal: within 60 s; before: 72 s, 4 trials, no cause).

Each part's result is kept as soon as it is measured (results/first_contact.partial.json,
per commit), so a run that stops resumes with the parts it lacks. --quick: the two short
parts once each, nothing kept.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.common import Benchmark, markdown_table, provenance

NAME = "first_contact"
ROOT = Path(__file__).resolve().parents[2]
DEBIAN_DATA = Path("/usr/share/datasets")
RUNS = 3
GOAL_NO_MEANS_S = 10.0
GOAL_DRIVER_ONLY_S = 60.0
BEFORE_DRIVER_ONLY_S = 72.0  # issue 22: the same grid before, 4 trials, no cause named
FRESH_CLONE_TIMEOUT_S = 1800

DRIVER_ONLY_SCRIPT = textwrap.dedent('''\
    """A driver whose dataset only it can read (a path on its own disk)."""
    import json, os, sys, time

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    import tula_ray
    from tula_ray.workloads import Workload

    DRIVER_PID = os.getpid()


    def images():
        if os.getpid() != DRIVER_PID:
            raise FileNotFoundError("no images under /data/my-images")
        generator = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn((4096, 3, 16, 16), generator=generator),
                             torch.randint(0, 5, (4096,), generator=generator))


    def model():
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 8 * 8, 5))


    started = time.perf_counter()
    try:
        tula_ray.search(Workload("my-images", model, images), cluster_sizes=(1, 2),
                        min_batch=32, max_batch=256, storage_path=sys.argv[1])
        outcome = {"raised": None}
    except Exception as error:  # noqa: BLE001 - what the user gets is the figure
        outcome = {"raised": type(error).__name__, "message": str(error).splitlines()[0],
                   "cause_named": "no images under /data/my-images" in str(error),
                   "worker_traceback": "in images" in str(error)}
    outcome["seconds"] = time.perf_counter() - started
    outcome["trial_dirs"] = len(list(os.scandir(sys.argv[1]))) if os.path.isdir(sys.argv[1]) else 0
    print(json.dumps(outcome))
    ''')


def _hide_debian_data(command: list[str], network: bool = True) -> list[str]:
    """`command` in private namespaces: without the Debian dataset package's directory
    (an empty directory mounted over it, where it exists) and, network=False, without
    any network. Needs root (unshare); nothing outside the namespaces changes."""
    flags = ["-m"] + ([] if network else ["-n"])
    inner = " ".join(f"'{part}'" for part in command)
    hide = f"mount --bind \"$(mktemp -d)\" {DEBIAN_DATA} && " if DEBIAN_DATA.is_dir() else ""
    return ["unshare", *flags, "sh", "-c", f"{hide}exec {inner}"]


def _can_unshare() -> bool:
    return shutil.which("unshare") is not None and os.geteuid() == 0 and subprocess.run(
        ["unshare", "-m", "-n", "true"], capture_output=True).returncode == 0


def no_means(runs: int) -> dict:
    """Seconds until `tula-ray demo` stops where the data are nowhere and nothing answers."""
    if not _can_unshare():
        return {"skipped": "needs root and unshare (a network namespace without routes)"}
    seconds, outcomes = [], []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tula-bare-") as home:
            env = {**os.environ, "HOME": home}
            for key in ("TULA_DATA_DIR", "TULA_CACHE_DIR", "XDG_CACHE_HOME"):
                env.pop(key, None)
            started = time.perf_counter()
            done = subprocess.run(
                _hide_debian_data([sys.executable, "-m", "tula_ray.cli", "demo", "--out",
                                   f"{home}/plan"], network=False),
                env=env, capture_output=True, text=True, timeout=120)
            seconds.append(time.perf_counter() - started)
            outcomes.append({"exit_code": done.returncode,
                             "says_what_to_do": "apt-get install dataset-fashion-mnist"
                                                in done.stderr and "TULA_DATA_DIR" in done.stderr,
                             "first_line": done.stderr.strip().splitlines()[0][:160]
                             if done.stderr.strip() else ""})
    return {"seconds": seconds, "median_s": statistics.median(seconds), "outcomes": outcomes,
            "met": max(seconds) <= GOAL_NO_MEANS_S and all(
                o["exit_code"] == 2 and o["says_what_to_do"] for o in outcomes)}


def driver_only_data(runs: int) -> dict:
    """Seconds from search() to its exception, for data only the driver can read."""
    outcomes = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="tula-driver-only-") as scratch:
            script = Path(scratch) / "driver.py"
            script.write_text(DRIVER_ONLY_SCRIPT)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, str(script), f"{scratch}/ray_results"],
                                  capture_output=True, text=True, timeout=600, cwd=scratch)
            wall = time.perf_counter() - started
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            outcome = json.loads(lines[-1]) if lines else {"raised": None,
                                                           "error": done.stderr[-500:]}
            outcomes.append({**outcome, "process_wall_s": wall})
    seconds = [o.get("seconds", float("nan")) for o in outcomes]
    return {"outcomes": outcomes, "seconds": seconds, "median_s": statistics.median(seconds),
            "met": all(o.get("cause_named") and o["seconds"] <= GOAL_DRIVER_ONLY_S
                       and o["trial_dirs"] == 0 for o in outcomes)}


def main_command() -> str:
    """README's main command, as .ci/run reads README's test command."""
    lines, inside = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.strip() == "<!-- main-command -->":
            inside = True
        elif line.strip() == "<!-- /main-command -->":
            break
        elif inside and not line.startswith("```"):
            lines.append(line)
    return "\n".join(lines).strip()


def fresh_clone() -> dict:
    """README's main command in a fresh clone of HEAD, empty home, no Debian data package."""
    if DEBIAN_DATA.is_dir() and not _can_unshare():
        return {"skipped": f"{DEBIAN_DATA} exists and cannot be hidden without root"}
    command = main_command()
    with tempfile.TemporaryDirectory(prefix="tula-fresh-") as scratch:
        clone, home = Path(scratch) / "tula-ray", Path(scratch) / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone,
                              capture_output=True, text=True, check=True).stdout.strip()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("TULA_", "VIRTUAL_ENV", "XDG_CACHE", "PYTHON"))}
        env["HOME"] = str(home)
        bash = ["bash", "-c", command]
        started = time.perf_counter()
        done = subprocess.run(_hide_debian_data(bash) if DEBIAN_DATA.is_dir() else bash,
                              cwd=clone, env=env, capture_output=True, text=True,
                              timeout=FRESH_CLONE_TIMEOUT_S)
        wall = time.perf_counter() - started
        printed = done.stdout.splitlines()
        source = next((line for line in printed if line.startswith("Fashion-MNIST: ")), "")
        choice = next((line for line in printed if line.startswith("choice (")), "")
        probe = next((line for line in printed if line.startswith("memory probe ")), "")
        return {"commit": head, "command": command, "exit_code": done.returncode,
                "wall_s": wall, "data_source": source, "choice": choice, "timings": probe,
                "plan_written": (clone / "plan" / "plan.json").is_file(),
                "stderr_tail": done.stderr[-1500:] if done.returncode else "",
                "met": done.returncode == 0 and (clone / "plan" / "plan.json").is_file()}


def run(quick: bool = False) -> dict:
    benchmark = Benchmark(NAME, quick)
    if quick:
        return benchmark.record({"parts": {"no_means": no_means(1),
                                           "driver_only_data": driver_only_data(1)}}, report)
    kept = benchmark.kept_parts(provenance()["commit"])
    for name, measure in (("no_means", lambda: no_means(RUNS)),
                          ("driver_only_data", lambda: driver_only_data(RUNS)),
                          ("fresh_clone", fresh_clone)):
        print(f"{name}: {json.dumps(kept.measure(name, measure))[:400]}", flush=True)
    return benchmark.record({"parts": kept.parts}, report)


def _seconds(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s [{min(values):.1f}, {max(values):.1f}]"


def report(result: dict) -> str:
    parts, rows = result["parts"], []
    fresh = parts.get("fresh_clone")
    if fresh and "skipped" not in fresh:
        rows.append([f"README's main command in a fresh clone (HEAD {fresh['commit']}), empty "
                     "home, no dataset package", "ends with a plan",
                     f"exit {fresh['exit_code']}, {fresh['wall_s']:.0f} s install included, "
                     f"plan written: {fresh['plan_written']}", "yes" if fresh["met"] else "no"])
    means = parts.get("no_means", {})
    if "skipped" not in means:
        rows.append(["`tula-ray demo`, no data and no network: seconds to stop, saying what to do",
                     f"<= {GOAL_NO_MEANS_S:.0f} s",
                     f"{_seconds(means['seconds'])}, exit "
                     f"{sorted({o['exit_code'] for o in means['outcomes']})}",
                     "yes" if means["met"] else "no"])
    driver = parts.get("driver_only_data", {})
    if driver:
        named = all(o.get("cause_named") for o in driver["outcomes"])
        trials = max(o.get("trial_dirs", -1) for o in driver["outcomes"])
        rows.append(["`search()`, data only the driver reads (B = 32-256): seconds to raise, "
                     "cause in the exception",
                     f"<= {GOAL_DRIVER_ONLY_S:.0f} s (before: {BEFORE_DRIVER_ONLY_S:.0f} s, "
                     "4 trials, no cause)",
                     f"{_seconds(driver['seconds'])}, cause named: {named}, trials started: "
                     f"{trials}", "yes" if driver["met"] else "no"])
    lines = ["## First contact (issue 22): a bare machine, a dataset the workers cannot read",
             "", f"`{result['command']}` at commit {result['commit']}, {result['date']}, "
             f"{result['machine']}. Each run is a fresh process with its own local Ray, one "
             "after the other; median [min, max] over the runs.", "",
             markdown_table(["what", "goal", "measured", "met"], rows)]
    if fresh and "skipped" not in fresh:
        lines += ["", f"- Main command: `{fresh['command']}`.",
                  f"- It printed: `{fresh['data_source']}`",
                  f"- `{fresh['timings']}`; `{fresh['choice'][:160]}`"]
    if driver:
        lines.append(f"- The exception raised: `{driver['outcomes'][0].get('raised')}: "
                     f"{driver['outcomes'][0].get('message', '')[:200]}`")
    if means and "skipped" not in means:
        lines.append(f"- The demo without data said: `{means['outcomes'][0]['first_line']}…`")
    for name, part in parts.items():
        if "skipped" in part:
            lines.append(f"- {name}: skipped ({part['skipped']})")
    return "\n".join(lines) + "\n"
