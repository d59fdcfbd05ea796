"""What every benchmark records beside its figures: the command, commit, date and machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# The commit a run's tree is at, when it runs from a copy whose git history is not the
# tree's (a device machine's copy of the working tree): set by whoever copied it.
COMMIT_ENV = "TULA_BENCHMARK_COMMIT"


def provenance() -> dict[str, Any]:
    given = os.environ.get(COMMIT_ENV)
    try:
        if given:
            raise OSError(f"{COMMIT_ENV} is set")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
        # Dirty: code changed since the commit. The benchmarks' own outputs (results/ and
        # BENCHMARKS.md, which a run rewrites as it goes) do not count.
        dirty = bool(subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":(exclude)benchmarks/results", ":(exclude)BENCHMARKS.md"],
            capture_output=True, text=True, cwd=Path(__file__).parents[2]).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = (f"{given} (from {COMMIT_ENV})" if given else "unknown"), False
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks", *sys.argv[1:]]),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
                   f"Python {platform.python_version()}",
    }
