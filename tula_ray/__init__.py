"""tula-ray: choose the cluster size N and global batch size B for data-parallel
training on Ray, then train it with Adaptive Gradient Scaling (the Tula paper).

The layers (DESIGN "Layers"; tests/layers.py holds the code to them), bottom up:
  the shared vocabulary  space, profile_table, failures, arguments, distributed, verbosity;
  core subpackages       models (eq. 2-4), workloads, ags (Algorithm 1), training, planning:
                         no Ray import;
  Ray-facing             cluster, and the top-level packages searchers/ and trainables/;
  entry points           runs (search, train, tune_training), then cli.

The entry points import Ray (and the workloads torch): they load on first use, so that
importing the package stays light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from tula_ray.failures import UserCodeError
from tula_ray.models.compute_forms import register_compute_form
from tula_ray.models.perf import register_collective
from tula_ray.models.pricing import FixedRate, MemoryRate, Pricing, register_pricing
from tula_ray.planning.noise_checks import NoiseScaleWarning
from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import Plan, build_plan
from tula_ray.planning.policy import Choice
from tula_ray.planning.search_strategies import register_search_strategy
from tula_ray.space import Candidate, SearchSpace

__version__ = "0.1.0"

_LAZY = {  # public name -> module that defines it (ray, or torch: heavy to import)
    "search": "tula_ray.runs.search",
    "train": "tula_ray.runs.train",
    "TrainResult": "tula_ray.runs.train",
    "tune_training": "tula_ray.runs.tune_training",
    "TuneResult": "tula_ray.runs.tune_training",
    "TulaOptimizer": "tula_ray.ags",
    "measure_noise_scale": "tula_ray.training.gradient_noise",
    "Workload": "tula_ray.workloads",
    "register_workload": "tula_ray.workloads",
    "register_training_strategy": "tula_ray.training.strategies",
}

# The extension points, one registration each (README "Extending tula-ray"): a search
# strategy, a training strategy, a pricing, a compute form, a collective, a workload.
__all__ = ["Candidate", "Choice", "FixedRate", "MemoryRate", "NoiseScaleWarning", "Plan",
           "PlanContext", "Pricing", "SearchSpace", "UserCodeError", "build_plan",
           "register_collective", "register_compute_form", "register_pricing",
           "register_search_strategy", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tula_ray' has no attribute {name!r}")
