"""Checks shared by the benchmarks' smoke tests.

tests/ has no __init__.py, so pytest's default "prepend" import mode puts it on sys.path
and the test modules import this one by name.
"""

import math


def finite(*values):
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def table_rows(markdown: str, header_start: str) -> list[list[str]]:
    """Cells of the rows of the markdown table whose header row starts with header_start."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:  # skip the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def summary_words(plan) -> str:
    """A plan's summary with its wrapping undone (tula_ray.verbosity.wrap): its words,
    single-spaced, so a phrase is found wherever a line broke it."""
    return " ".join(plan.summary().split())
