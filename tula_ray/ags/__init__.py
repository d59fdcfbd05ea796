"""Adaptive Gradient Scaling (paper §III-C, Algorithm 1), as a torch optimizer.

  equations  eq. 5 (gradient variability), Algorithm 1's s_max and scale (eq. 8), AdaScale's
             gain ratio: pure functions;
  optimizer  `TulaOptimizer`, the literal Algorithm 1 and its variants as options;
  sources    where the small-batch gradient comes from: a sub-batch (`backward_with_refresh`)
             or each DDP worker's own gradient (`register_local_gradient_hook`).

Core: no Ray. The names users import (docs/guide/training.md) are re-exported here.
"""

from tula_ray.ags.equations import (DELTA_DEFAULT, EMA_DECAY_DEFAULT, EPS_DEFAULT, ESTIMATORS,
                                    GAIN_EXPONENT_PAPER, GRANULARITIES, REFRESH_EPOCH,
                                    SMALL_BATCH_DEFAULT, SOURCES, gain_ratio,
                                    gradient_variability, max_scale, scale_factor)
from tula_ray.ags.optimizer import TulaOptimizer
from tula_ray.ags.sources import backward_with_refresh, register_local_gradient_hook

__all__ = ["DELTA_DEFAULT", "EMA_DECAY_DEFAULT", "EPS_DEFAULT", "ESTIMATORS",
           "GAIN_EXPONENT_PAPER", "GRANULARITIES", "REFRESH_EPOCH", "SMALL_BATCH_DEFAULT",
           "SOURCES", "TulaOptimizer", "backward_with_refresh", "gain_ratio",
           "gradient_variability", "max_scale", "register_local_gradient_hook", "scale_factor"]
