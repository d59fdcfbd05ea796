"""From profiles to a plan: which candidates to profile, what each would take, which to choose.

  bounds             the search's bounds on B from the memory probe's measurements: the
                     device budget, the cap, the bound check, the space up to the bound;
  search_strategies  the protocol and the registry of search strategies (full, partial);
  adaptive_search    the adaptive strategy, which plans as it goes (registered here);
  estimates          the predicted table and the dense curve the policy chooses on;
  candidates         the plan's table: predicted, measured beside it, which it may choose;
  policy             min time, min cost, knee, weighted; ties within noise;
  noise_trajectory   phi over a run's progress, fitted to the profiles or constant;
  adaptive_batch     an adaptive-batch run's seconds: goodput integrated over that trajectory;
  adaptive_rows      the plan's row "adaptive at N" per N, and when the choice takes it;
  context            `PlanContext`: what a plan needs beyond its rows, checked once, its defaults;
  plan               `build_plan` and the `Plan` it returns (JSON round trip, plots in plotting);
  summary            the plan's summary as a person reads it: 100 columns, the rows that matter;
  synthetic          profiles drawn from known parameters (tests, examples, offline replays).

Core: no Ray; above models, beside training.
"""

# Registers the adaptive search strategy beside full and partial: whoever reads the
# registry has imported this package first.
from tula_ray.planning import adaptive_search  # noqa: E402,F401  (registers)

__all__ = ["adaptive_search"]
