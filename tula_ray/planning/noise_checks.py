"""When the profiled noise scale cannot be trusted, and what the plan does then (issue 41,
item 2).

The profiles measure |G|^2 and tr(Sigma) on a barely trained model, in a few steps per
row (`tula_ray.planning.accuracy.profiled_noise`). A model whose signal is small next to
its noise gives a pooled |G|^2 near 0, rows with a negative one, and a phi (their ratio)
that says nothing. Then every batch needs nearly the same epochs, and an objective "to
accuracy" becomes the plain per-epoch one, which picks the largest batch. So the plan
warns (`NoiseScaleWarning`), naming what to do, and chooses by a rule that needs no phi.

Core: no Ray.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from tula_ray.planning.accuracy import ProfiledNoise
from tula_ray.planning.policy import ACCURACY_OBJECTIVES, Choice, choose

# Every candidate's efficiency E(B) within this of 1: the objective "to accuracy" ranks
# the candidates as the per-epoch one does.
COLLAPSE_TOLERANCE = 0.05
# What a "to accuracy" objective falls back to when phi cannot be used: the knee of the
# predicted training time over B (the paper's own rule), which needs no noise scale and
# does not run to the largest batch.
FALLBACK_OBJECTIVE = "knee"
WHAT_TO_DO = ("measure phi at the target with tula_ray.measure_noise_scale and pass it as "
              "noise_scale=, or profile more steps (measure_steps=)")


class NoiseScaleWarning(UserWarning):
    """The plan's noise scale phi is not to be trusted; the message says why and what to do."""


def noise_problems(noise: ProfiledNoise, efficiency: pd.Series, dataset_size: int,
                   objective: str) -> list[str]:
    """Why the plan's phi is not to be trusted, one sentence each (empty: no reason)."""
    problems = []
    measured = noise.steps > 0 and np.isnan(noise.given)
    if measured and noise.negative_rows:
        problems.append(f"{noise.negative_rows} of {noise.rows} profiles measured a negative "
                        "|G|^2 (a noisy pair of gradients); they are pooled with the rest")
    if measured and not noise.has_signal:
        problems.append(f"the pooled |G|^2 = {noise.grad_sqr:.3g} is within its standard "
                        f"error {noise.grad_sqr_se:.3g} of 0: phi has no signal")
    phi = noise.noise_scale
    if np.isfinite(phi) and phi > dataset_size:
        problems.append(f"phi = {phi:.4g} exceeds the training set ({dataset_size} "
                        "samples)")
    if objective in ACCURACY_OBJECTIVES and collapsed(efficiency):
        problems.append(f"every candidate's efficiency is within {COLLAPSE_TOLERANCE:.0%} "
                        f"of 1: {objective} ranks them as the per-epoch objective does")
    return problems


def collapsed(efficiency: pd.Series) -> bool:
    """Whether every efficiency is within `COLLAPSE_TOLERANCE` of 1."""
    values = efficiency.dropna().to_numpy(float)
    return len(values) > 0 and bool((np.abs(values - 1.0) <= COLLAPSE_TOLERANCE).all())


def warn_of(problems: list[str]) -> str:
    """Warn (NoiseScaleWarning) of `problems`, naming what to do; returns the message."""
    message = "; ".join(problems) + f". To plan to an accuracy, {WHAT_TO_DO}."
    warnings.warn(message, NoiseScaleWarning, stacklevel=3)
    return message


def fallback_objective(objective: str, noise: ProfiledNoise,
                       efficiency: pd.Series) -> str | None:
    """The objective to choose by instead of `objective`, or None to keep it: a "to
    accuracy" objective with a phi of the profiles' that has no signal, or has collapsed
    to the per-epoch ranking (a phi the user gave is the user's to keep)."""
    if objective not in ACCURACY_OBJECTIVES or not np.isnan(noise.given):
        return None
    unusable = noise.steps > 0 and (not noise.has_signal or collapsed(efficiency))
    return FALLBACK_OBJECTIVE if unusable else None


def choose_to_accuracy(estimates: pd.DataFrame, objective: str, noise: ProfiledNoise,
                       dataset_size: int, **choose_options: Any) -> tuple[Choice, str]:
    """`policy.choose` by `objective`, after the checks of phi: with a problem, a
    NoiseScaleWarning naming it and what to do; with a "to accuracy" objective phi cannot
    serve (`fallback_objective`), the choice by `FALLBACK_OBJECTIVE`, its reason saying
    so. Returns (the choice, the warning's message or "")."""
    feasible = estimates[estimates["feasible"]] if "feasible" in estimates else estimates
    problems = noise_problems(noise, feasible["efficiency"], dataset_size, objective)
    message = warn_of(problems) if problems else ""
    fallback = fallback_objective(objective, noise, feasible["efficiency"])
    if fallback is None:
        return choose(estimates, objective, **choose_options), message
    choice = choose(estimates, fallback, **choose_options)
    return replace(choice, reason=f"{objective} fell back to the {fallback} rule, which needs "
                                  f"no noise scale (the profiles' phi cannot tell how many "
                                  f"epochs a larger batch needs): {choice.reason}"), message
