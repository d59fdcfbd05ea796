"""The adaptive-batch benchmark's fixed runs read against E(B) (added after version 4's
runs; no goal reads it): the statistical efficiency that the plan and the adaptive
controller assume, E(B) = (phi + M0) / (phi + B) (`tula_ray.models.goodput`), set
against the one the fixed runs show.

For each target and fixed B, on the selection seeds only (every fixed B runs there, and
the scoring seeds stay untouched by anything estimated from this table):
  - E(B) measured = the median samples to the target at M0 (the smallest fixed B) over
    the median samples at B;
  - the phi that makes E(B) = (phi + M0) / (phi + B) give it, `implied_noise_scale`;
  - the online phi (`tula_ray.training.online_noise`) the runs at B recorded at the
    evaluation that reached the target, median over the runs;
  - the online phi along the way, which is what the implied one is to be read against:
    with phi(s) along M0's run (s its samples), B needs the integral of
    (phi + B) / (phi + M0) ds samples, so the single phi that gives the same count is
    the harmonic mean of phi + M0 over M0's samples, less M0 (`trajectory_noise_scale`:
    M0's evaluations to the target, which are evenly spaced in samples; median over
    its runs).
An implied phi above the online one says the fixed runs used large batches better than
E(B) with the measured phi predicts. No Ray, no training: the recorded runs alone.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.accuracy.adaptive_batch_runs import ADAPTIVE, evaluations_to
from benchmarks.common import markdown_table


def implied_noise_scale(efficiency: float, global_batch: int, reference_batch: int) -> float:
    """The phi for which (phi + M0) / (phi + B) = `efficiency` (M0 = `reference_batch`):
    phi = (B E - M0) / (1 - E); inf when E >= 1 (B as efficient as M0 per sample), nan
    when E < M0 / B (fewer samples' worth than even a noiseless gradient allows)."""
    if efficiency >= 1:
        return math.inf
    implied = (global_batch * efficiency - reference_batch) / (1 - efficiency)
    return implied if implied >= 0 else math.nan


def trajectory_noise_scale(phis: list[float], reference_batch: int) -> float:
    """The one phi for which E(B) = (phi + M0) / (phi + B) takes as many samples as phi
    varying along M0's run through `phis` (evenly spaced in samples): the harmonic mean of
    phi + M0, less M0 (see the module's docstring)."""
    return len(phis) / sum(1 / (phi + reference_batch) for phi in phis) - reference_batch


def efficiency_rows(runs: list[dict], workload: str, seeds, target: float
                    ) -> list[dict[str, Any]]:
    """One row per fixed B (see the module's docstring); [] without the online phi."""
    by_batch: dict[int, list[list[dict]]] = {}
    for run in runs:
        if run["workload"] == workload and run["batch"] != ADAPTIVE and run["seed"] in seeds:
            evaluations = evaluations_to(run, target)
            if evaluations:
                by_batch.setdefault(int(run["batch"]), []).append(evaluations)
    if not by_batch or any("noise_scale" not in row for found in by_batch.values()
                           for evaluations in found for row in evaluations):
        return []
    reference = min(by_batch)
    reference_samples = statistics.median(e[-1]["samples"] for e in by_batch[reference])
    along = statistics.median(
        trajectory_noise_scale([row["noise_scale"] for row in evaluations], reference)
        for evaluations in by_batch[reference])
    rows = []
    for batch in sorted(by_batch):
        samples = statistics.median(e[-1]["samples"] for e in by_batch[batch])
        efficiency = reference_samples / samples
        rows.append({"batch": batch, "runs": len(by_batch[batch]), "samples": samples,
                     "efficiency": efficiency,
                     "implied": implied_noise_scale(efficiency, batch, reference),
                     "online": statistics.median(e[-1]["noise_scale"]
                                                 for e in by_batch[batch]),
                     "along": along})
    return rows


def _figure(value: float) -> str:
    return "n/a" if math.isnan(value) else ("inf" if math.isinf(value) else f"{value:.0f}")


def efficiency_lines(result: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    """The section's markdown: a table per target, and the implied / online phi ratio's
    median over the batches above M0 where both are finite."""
    seeds = result["protocol"]["selection_seeds"]
    lines: list[str] = []
    for target in workload["targets"]:
        rows = efficiency_rows(result["runs"], workload["name"], seeds, target)
        if not rows:
            continue
        ratios = [r["implied"] / r["along"] for r in rows[1:]
                  if math.isfinite(r["implied"]) and r["along"] > 0]
        body = [[r["batch"], r["runs"], f"{r['samples']:.0f}", f"{r['efficiency']:.2f}",
                 _figure(r["implied"]), _figure(r["online"])] for r in rows]
        lines += [f"At {target:.0%}:\n",
                  markdown_table(["B", "runs", "median samples", "E(B) measured",
                                  "implied phi", "online phi at the target"], body), "",
                  f"- online phi along M0's runs (B = {rows[0]['batch']}) to the target: "
                  f"{_figure(rows[0]['along'])}; implied / that, median over the larger "
                  "batches: " + (f"{statistics.median(ratios):.2f} ({len(ratios)} batches)"
                                 if ratios else "n/a"), ""]
    if not lines:
        return []
    return ["Added after the runs (no goal reads it): the fixed runs' statistical efficiency "
            "against E(B) = (phi + M0) / (phi + B), on the selection seeds "
            f"{list(seeds)} (`adaptive_batch_efficiency.py`).\n", *lines]
