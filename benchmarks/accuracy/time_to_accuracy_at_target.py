"""Time to accuracy with phi at each target (issue 25): the plans of `time_to_accuracy`'s
searches re-made with `noise_scale=`, phi measured as a user would measure it.

phi grows as a model trains, and the trade-off between steps and epochs to a target is
the one at that target (McCandlish et al.), while a search's profiles measure a barely
trained model. So, per target: the reference recipe (plain SGD at B = 32, which AGS-NS
trains there; the workload's SGD; seed 0; one process, the same gradient as two workers'
mean) is trained toward the target's step S0 = E0 x subset / 32 (E0 the epochs the
reference runs needed), and `tula_ray.measure_noise_scale(workload, model, steps=W)`
measures phi from W / 2 steps before S0, its pairs spread over W steps of a copy's
continuation (W: one epoch of the subset; `MEASURE_SEEDS` seeds, their median): phi
averaged over the iterates around S0. Beside it, phi of the single iterate at S0 (`steps`
0), which moves a lot from iterate to iterate. E0 is the issue's; the window, one epoch,
was chosen after the single iterate's phi missed (82, 86, 87 %: 90, 219, 161 at a26ac4d,
where `noise-evolution`'s trace pooled within half an epoch gave 112, 120, 318).

Beside them, a cross-check: `noise-evolution`'s trace of the same recipe, its points
within half an epoch of S0 pooled (`phi_near`); not used for the choices.

Resumable: each measurement is appended to time_to_accuracy.noise.jsonl; a run cut off
before the last one trains the reference again from its start (its weights are not kept).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import RESULTS_DIR, provenance

MEASURE_SEEDS = (0, 1, 2)
# --quick: a smoke test's pairs (the full run takes the default, 160). 4, as noise-evolution's
# --quick takes: at its targets phi is 30 to 90, under the pairs' halves of 128 samples, so
# |G|^2 stays resolved; 16 pairs took most of the smoke test's time.
QUICK_PAIRS = 4


def measured_phis(settings: dict, steps: dict[str, float], window: int, quick: bool,
                  log: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """{"window" | "iterate": {target: {"step", "noise_scale" (the median), "seeds"}}}: phi
    over `window` steps around each target's step and at that step alone, along one
    reference run (trained once, in order of the steps), recorded in `log`; a log holding
    every measurement is read back instead."""
    events = sorted([(max(0.0, at - window / 2), "window", t) for t, at in steps.items()]
                    + [(at, "iterate", t) for t, at in steps.items()])
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] \
        if log.exists() else []
    found: dict[str, dict[str, dict[str, Any]]] = {"window": {}, "iterate": {}}
    for record in records:
        if "kind" in record:  # a record of the single iterate only (a26ac4d) is stale
            found[record["kind"]][record["target"]] = record
    if all(t in found[kind] for _, kind, t in events):
        return found
    log.unlink(missing_ok=True)  # a part-way log: its weights are gone, start over
    found = {"window": {}, "iterate": {}}
    import torch

    import tula_ray
    from benchmarks.accuracy.time_to_accuracy_runs import REFERENCE_BATCH, held_out_workload
    from tula_ray.training.batches import training_batches
    from tula_ray.training.strategy_base import StrategySetup

    workload = held_out_workload(settings["train_subset"], settings["held_out"])
    torch.manual_seed(0)
    model = workload.model_fn().train()
    setup = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    loss_fn, dataset = workload.loss_fn(), workload.train_dataset_fn()
    options = {"pairs": QUICK_PAIRS} if quick else {}
    commit = provenance()["commit"]  # git, run once: not once per measurement
    step, epoch = 0, 0
    while events:
        batches = training_batches(dataset, REFERENCE_BATCH, "cpu", seed=0)
        batches.set_epoch(epoch)
        for inputs, targets in batches:
            while events and step >= events[0][0]:
                _, kind, target = events.pop(0)
                along = window if kind == "window" else 0
                phis = [tula_ray.measure_noise_scale(workload, model, seed=seed, steps=along,
                                                     train_batch=REFERENCE_BATCH, **options)
                        for seed in MEASURE_SEEDS]
                found[kind][target] = {"kind": kind, "target": target, "step": step,
                                       "steps": along, "seeds": phis,
                                       "noise_scale": statistics.median(phis),
                                       "commit": commit}
                with log.open("a") as stream:
                    stream.write(json.dumps(found[kind][target]) + "\n")
            if not events:
                break
            setup.train_step(model, loss_fn, inputs, targets)
            step += 1
        epoch += 1
    return found


def at_target(plans: list, truth: dict, settings: dict, quick: bool, judge: Callable,
              searched: Callable) -> dict[str, Any]:
    """Every search's plan re-made per target with the measured phi at that target
    (`judge(..., noise_scale=)` on `train`'s clock), and the trace's cross-check."""
    from benchmarks.accuracy.time_to_accuracy_runs import NAME, REFERENCE_BATCH

    train_size = settings["train_subset"]
    steps = {str(t): truth[t][REFERENCE_BATCH]["epochs"] * train_size / REFERENCE_BATCH
             for t in settings["targets"]
             if math.isfinite(truth[t][REFERENCE_BATCH]["epochs"])}
    log = RESULTS_DIR / f"{NAME}{'_quick' if quick else ''}.noise.jsonl"
    if quick:  # a smoke test starts afresh
        log.unlink(missing_ok=True)
    window = train_size // REFERENCE_BATCH  # one epoch of the reference run
    phis = measured_phis(settings, steps, window, quick, log)

    def with_phi(kind: str) -> list[dict[str, Any]]:
        judged = [{t: judge(p, truth[float(t)], train_size, settings["held_out"],
                            "train_seconds", noise_scale=phis[kind][t]["noise_scale"])
                   for t in steps} for p in plans]
        return [searched(p, j) for p, j in zip(plans, judged)]

    return {"phi": phis["window"], "iterate_phi": phis["iterate"], "window_steps": window,
            "pairs": QUICK_PAIRS if quick else "default",
            "searches": with_phi("window"), "iterate_searches": with_phi("iterate"),
            "trace": None if quick else traced(steps, window // 2)}


def traced(steps: dict[str, float], window: int) -> dict[str, Any] | None:
    """The cross-check: `noise-evolution`'s trace of the reference recipe, pooled within
    `window` steps of each target's step; None without that trace."""
    from benchmarks.accuracy.noise_evolution import SUBSET_TRACE

    path = RESULTS_DIR / "noise_evolution.json"
    recorded = json.loads(path.read_text()) if path.exists() else {"traces": {}}
    trace = recorded["traces"].get(SUBSET_TRACE)
    if not trace:
        return None
    return {"commit": recorded["provenance"]["commit"], "window_steps": window,
            "phi": {t: phi_near(trace, step, window) for t, step in steps.items()}}


def phi_near(trace: list[dict], step: float, window: int) -> dict[str, float]:
    """phi at `step` of a traced run: |G|^2 and tr(Sigma) of the points within `window`
    steps of it, each weighted by its pairs, then their ratio (single points of 32 pairs
    scatter by a factor of several; their pooled sums do not)."""
    from tula_ray.models.noise_scale import noise_scale

    near = [p for p in trace if abs(p["step"] - step) <= window]
    pairs = sum(p["pairs"] for p in near)
    if not pairs:
        raise ValueError(f"the trace has no point within {window} steps of step {step:.0f}")
    grad_sqr = sum(p["grad_sqr"] * p["pairs"] for p in near) / pairs
    grad_var = sum(p["grad_var"] * p["pairs"] for p in near) / pairs
    return {"step": step, "noise_scale": noise_scale(grad_sqr, grad_var),
            "points": len(near), "pairs": pairs}
