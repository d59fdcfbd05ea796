"""AGS's options, checked: the constructor's (`check_options`) and a param group's
hyper-parameters (`check_group`: they may be set per group, or by a scheduler). Each error
names the value given and what is allowed. No Ray here (core module).
"""

from __future__ import annotations

from typing import Any

import torch

from tula_ray.ags.equations import DELTA_DEFAULT, ESTIMATORS, GRANULARITIES, REFRESH_EPOCH, SOURCES
from tula_ray.arguments import check_choice, check_int

# In every param group (a scheduler may set them); delta None: the gate off.
GROUP_HYPERPARAMETERS = ("delta", "s_max", "s_min", "eps", "gain_exponent", "ema_decay")


def check_group(group: dict[str, Any]) -> None:
    """A param group's AGS hyper-parameters (they may be set per group, or by a scheduler)."""
    delta, s_max, s_min, eps, exponent, decay = (group[name] for name in GROUP_HYPERPARAMETERS)
    if delta is not None and not delta >= 0:
        raise ValueError(f"delta={delta!r}: the variability threshold must be >= 0, or None for "
                         f"no gate (paper default {DELTA_DEFAULT})")
    if not s_max > 0:
        raise ValueError(f"s_max={s_max!r}: must be > 0 (default (large/small batch)^p)")
    if not 0 <= s_min <= s_max:
        raise ValueError(f"s_min={s_min!r}: need 0 <= s_min <= s_max ({s_max:.4g})")
    if not eps > 0:
        raise ValueError(f"eps={eps!r}: the stability term must be > 0")
    if not 0 < exponent <= 2:
        raise ValueError(f"gain_exponent={exponent!r}: need 0 < p <= 2 (paper 1/2, AdaScale 1)")
    if not 0 <= decay < 1:
        raise ValueError(f"ema_decay={decay!r}: need 0 <= decay < 1")


def check_options(base_optimizer: Any, large_batch: int, small_batch: int, refresh_every: Any,
                  granularity: str, source: str, estimator: str) -> None:
    """TulaOptimizer's constructor arguments: the wrapped optimizer, the two batches, the
    refresh period and the choices of granularity, source and estimator."""
    if not isinstance(base_optimizer, torch.optim.Optimizer):
        raise TypeError(f"base_optimizer must be a torch.optim.Optimizer, "
                        f"not {type(base_optimizer).__name__}")
    check_int("small_batch", small_batch, minimum=1)
    check_int("large_batch", large_batch, minimum=1)
    if not small_batch < large_batch:
        raise ValueError(f"small_batch={small_batch!r}, large_batch={large_batch!r}: need "
                         "0 < small_batch < large_batch")
    if isinstance(refresh_every, str):
        check_choice("refresh_every", refresh_every, (REFRESH_EPOCH,),
                     hint="or a number of steps >= 1")
    else:
        check_int("refresh_every", refresh_every, minimum=1, hint=f"or {REFRESH_EPOCH!r}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is unknown; use one of {GRANULARITIES}")
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is unknown; use one of {SOURCES}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator={estimator!r} is unknown; use one of {ESTIMATORS}")
    if estimator == "ema" and granularity != "tensor":
        raise ValueError("estimator='ema' averages per-tensor norms: use granularity='tensor'")

