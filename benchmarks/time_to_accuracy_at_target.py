"""Time to accuracy with phi at each target (issue 25): the plans of `time_to_accuracy`'s
searches re-made with `noise_scale=`, phi measured as a user would measure it.

phi grows as a model trains, and the trade-off between steps and epochs to a target is
the one at that target (McCandlish et al.), while a search's profiles measure a barely
trained model. So, per target: the reference recipe (plain SGD at B = 32, which AGS-NS
trains there; the workload's SGD; seed 0; one process, the same gradient as two workers'
mean) is trained to the target's step S0 = E0 x subset / 32 (E0 the epochs the
reference runs needed), and `tula_ray.measure_noise_scale(workload, model)` measures phi
there, with `MEASURE_SEEDS` seeds of its pairs (their median). Nothing is fitted to the
ground truth: E0 is the issue's, and the measurement has no free parameter.

Beside it, a cross-check: `noise-evolution`'s trace of the same recipe, its points within
half an epoch of S0 pooled (`phi_near`); not used for the choices.

Resumable: each target's measurement is appended to time_to_accuracy.noise.jsonl; a run
cut off before the last one trains the reference again from its start (its weights are
not kept).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import RESULTS_DIR, provenance

MEASURE_SEEDS = (0, 1, 2)
QUICK_PAIRS = 16  # --quick: a smoke test's pairs (the full run takes the default, 160)


def measured_phis(settings: dict, steps: dict[str, float], quick: bool,
                  log: Path) -> dict[str, dict[str, Any]]:
    """{target: {"step", "noise_scale" (the median), "seeds"}}: phi measured at each
    target's step of one reference run (trained once, in order of the steps), recorded
    in `log`; a log holding every target is read back instead."""
    records = {r["target"]: r for r in map(json.loads, log.read_text().splitlines())
               if r} if log.exists() else {}
    if set(steps) <= set(records):
        return {t: records[t] for t in steps}
    log.unlink(missing_ok=True)  # a part-way log: its weights are gone, start over
    import torch

    import tula_ray
    from benchmarks.time_to_accuracy import REFERENCE_BATCH, held_out_workload
    from tula_ray.training.batches import training_batches
    from tula_ray.training.strategy_base import StrategySetup

    workload = held_out_workload(settings["train_subset"], settings["held_out"])
    torch.manual_seed(0)
    model = workload.model_fn().train()
    setup = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    loss_fn, dataset = workload.loss_fn(), workload.train_dataset_fn()
    options = {"pairs": QUICK_PAIRS} if quick else {}
    found, step, epoch = {}, 0, 0
    pending = sorted(steps.items(), key=lambda item: item[1])
    while pending:
        batches = training_batches(dataset, REFERENCE_BATCH, "cpu", seed=0)
        batches.set_epoch(epoch)
        for inputs, targets in batches:
            while pending and step >= pending[0][1]:
                target, at = pending.pop(0)
                phis = [tula_ray.measure_noise_scale(workload, model, seed=seed, **options)
                        for seed in MEASURE_SEEDS]
                found[target] = {"target": target, "step": at, "seeds": phis,
                                 "noise_scale": statistics.median(phis),
                                 "commit": provenance()["commit"]}
                with log.open("a") as stream:
                    stream.write(json.dumps(found[target]) + "\n")
            if not pending:
                break
            setup.train_step(model, loss_fn, inputs, targets)
            step += 1
        epoch += 1
    return found


def at_target(plans: list, truth: dict, settings: dict, quick: bool, judge: Callable,
              searched: Callable) -> dict[str, Any]:
    """Every search's plan re-made per target with the measured phi at that target
    (`judge(..., noise_scale=)` on `train`'s clock), and the trace's cross-check."""
    from benchmarks.time_to_accuracy import NAME, REFERENCE_BATCH

    train_size = settings["train_subset"]
    steps = {str(t): truth[t][REFERENCE_BATCH]["epochs"] * train_size / REFERENCE_BATCH
             for t in settings["targets"]
             if math.isfinite(truth[t][REFERENCE_BATCH]["epochs"])}
    log = RESULTS_DIR / f"{NAME}{'_quick' if quick else ''}.noise.jsonl"
    phis = measured_phis(settings, steps, quick, log)
    judged = [{t: judge(p, truth[float(t)], train_size, settings["held_out"], "train_seconds",
                        noise_scale=phis[t]["noise_scale"]) for t in phis} for p in plans]
    return {"phi": phis, "pairs": QUICK_PAIRS if quick else "default",
            "searches": [searched(p, j) for p, j in zip(plans, judged)],
            "trace": None if quick else traced(steps, train_size // REFERENCE_BATCH // 2)}


def traced(steps: dict[str, float], window: int) -> dict[str, Any] | None:
    """The cross-check: `noise-evolution`'s trace of the reference recipe, pooled within
    `window` steps of each target's step; None without that trace."""
    from benchmarks.noise_evolution import SUBSET_TRACE

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
