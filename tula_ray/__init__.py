"""tula-ray: choose the cluster size N and global batch size B for data-parallel
training on Ray, then train it with Adaptive Gradient Scaling (the Tula paper).

The core modules (space, perf, memory, pricing, policy, plan) never import Ray;
`search` is loaded on first use so that importing the core stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from tula_ray.plan import Plan, build_plan
from tula_ray.policy import Choice
from tula_ray.pricing import FixedRate, MemoryRate, Pricing
from tula_ray.space import Candidate, SearchSpace

__version__ = "0.1.0"

_LAZY = {  # public name -> module that defines it (ray, or torch: heavy to import)
    "search": "tula_ray.api",
    "train": "tula_ray.relaunch",
    "TrainResult": "tula_ray.relaunch",
    "TulaOptimizer": "tula_ray.ags",
}

__all__ = ["Candidate", "Choice", "FixedRate", "MemoryRate", "Plan", "Pricing",
           "SearchSpace", "build_plan", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tula_ray' has no attribute {name!r}")
