"""The extension files of tests/extensions/, each written as a user would write it (the
`registries` fixture of conftest.py restores the registries around a test that adds one)."""

from __future__ import annotations

from pathlib import Path

EXTENSIONS = Path(__file__).parent / "extensions"
FILES = {name: EXTENSIONS / f"{name}.py" for name in (
    "diagonal_search", "flat_fee_pricing", "sqrt_compute_form", "tiny_workload", "adam_strategy")}
