"""How a benchmark summarises a sample of errors or ratios for its tables."""

from __future__ import annotations

import numpy as np


def relative_errors(predicted, measured) -> np.ndarray:
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    return np.abs(predicted - measured) / measured


def spread(values) -> str:
    """median [min, max] of a sample, for printing beside a figure."""
    values = np.asarray(values, float)
    return f"{np.median(values):.1%} [{values.min():.1%}, {values.max():.1%}]"


def cross_search_errors(partial_plan, full_plan):
    """(merged tables, relative errors) of a partial search's predicted step times against the
    step times a separate full search measured: model error plus run-to-run noise."""
    merged = partial_plan.table.merge(full_plan.table, on=["num_workers", "global_batch"],
                                      suffixes=("_partial", "_full"))
    errors = relative_errors(merged["step_time_s_partial"], merged["measured_step_time_s_full"])
    return merged, errors
