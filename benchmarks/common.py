"""What every benchmark records beside its figures: the command, commit, date and machine."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).parent / "results"


def provenance() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks", *sys.argv[1:]]),
        "commit": commit + ("+dirty" if dirty else ""),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
                   f"Python {platform.python_version()}",
    }


def relative_errors(predicted, measured) -> np.ndarray:
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    return np.abs(predicted - measured) / measured


def spread(values) -> str:
    """median [min, max] of a sample, for printing beside a figure."""
    values = np.asarray(values, float)
    return f"{np.median(values):.1%} [{values.min():.1%}, {values.max():.1%}]"


def write_result(name: str, result: dict[str, Any], markdown: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=float))
    (RESULTS_DIR / f"{name}.md").write_text(markdown)
    return path
