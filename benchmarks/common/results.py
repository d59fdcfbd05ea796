"""benchmarks/results/: where every benchmark writes NAME.json (what it measured) and NAME.md
(its report, made from that JSON alone), and reads them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parents[1] / "results"


def write_result(name: str, result: dict[str, Any], markdown: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=float))
    (RESULTS_DIR / f"{name}.md").write_text(markdown)
    return path


def read_result(name: str) -> dict[str, Any]:
    """The result a run recorded (results/NAME.json), as a report reads it: JSON's types
    (string keys, lists for tuples), whichever process wrote it."""
    return json.loads((RESULTS_DIR / f"{name}.json").read_text())
