"""Markdown for the benchmarks' reports: the one way a benchmark writes a table."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header row, a `|---|` separator per column, one line per row.

    header: the column titles. rows: per row its cells, written with str() and a space on
      either side; None leaves a cell blank (`| |`), while "" is an empty string (`|  |`).
    The rows follow the separator on their own line, and no newline ends the table: a
    table without rows ends with its separator and a newline (an empty line of rows).
    """
    lines = [_row(header), "|" + "---|" * len(header)]
    return "\n".join(lines + ["\n".join(_row(cells) for cells in rows)])


def _row(cells: Sequence[Any]) -> str:
    return "|" + "|".join(" " if cell is None else f" {cell} " for cell in cells) + "|"
