"""tula-ray: choose the cluster size N and global batch size B for data-parallel
training on Ray, then train it with Adaptive Gradient Scaling (the Tula paper).

The core modules (space, perf, memory, pricing, policy, plan, ...) never import
Ray. The entry points that do, `search` (module `tula_ray.search`) and `train`
(module `tula_ray.train`), are loaded on first use so that importing the core
stays light.
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import Any

from tula_ray.failures import UserCodeError
from tula_ray.plan import Plan, build_plan
from tula_ray.policy import Choice
from tula_ray.pricing import FixedRate, MemoryRate, Pricing
from tula_ray.space import Candidate, SearchSpace

__version__ = "0.1.0"

_LAZY = {  # public name -> module that defines it (ray, or torch: heavy to import)
    "search": "tula_ray.search",
    "train": "tula_ray.train",
    "TrainResult": "tula_ray.train",
    "tune_training": "tula_ray.tune_training",
    "TuneResult": "tula_ray.tune_training",
    "TulaOptimizer": "tula_ray.ags",
}

__all__ = ["Candidate", "Choice", "FixedRate", "MemoryRate", "Plan", "Pricing",
           "SearchSpace", "UserCodeError", "build_plan", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tula_ray' has no attribute {name!r}")


class _Package(types.ModuleType):
    """The package, where `tula_ray.search` and `tula_ray.train` stay the functions.

    The modules that define them carry the same names, and the import system binds a
    submodule to its package's attribute when it first loads it: without this,
    `tula_ray.search(...)` would call a module once anything imported
    `tula_ray.search` the module. (Import from the modules with `from tula_ray.search
    import ...`.)
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == value.__name__:
            return  # the name keeps resolving to the function, through __getattr__
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
