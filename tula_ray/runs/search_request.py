"""A search's arguments, checked and held as one value (`SearchRequest`): each plain
argument's type and range before anything is built, what depends on several of them, and
what depends on the training set once a worker has read it. Ray-facing only through the
cluster checks it shares with the other entry points; the search entry's own module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from tula_ray.arguments import (check_bool, check_choice, check_int, check_mapping, check_number,
                                check_text, named_arguments)
from tula_ray.cluster import check_runtime_env, check_worker_request
from tula_ray.models.pricing import Pricing, parse_pricing
from tula_ray.planning.context import check_plan_values
from tula_ray.planning.search_strategies import SEARCH_STRATEGIES, make_search_strategy
from tula_ray.space import check_batch_in_dataset, check_positive_ints
from tula_ray.training.strategies import get_training_strategy
from tula_ray.training.strategy_base import (TrainingStrategy, check_base_optimizer,
                                             check_option_names)
from tula_ray.verbosity import check_verbose
from tula_ray.workloads import Workload, in_precision, resolve_workload

logger = logging.getLogger(__name__)


def check_search_arguments(a: dict[str, Any]) -> None:
    """Each plain argument's type and range, before anything is built (issue 13, item 4)."""
    if not isinstance(a["cluster_sizes"], (list, tuple)):
        raise TypeError(f"cluster_sizes={a['cluster_sizes']!r}; it must be a list or tuple of "
                        "positive integers")
    check_positive_ints("cluster_sizes", a["cluster_sizes"])
    check_choice("search_strategy", a["search_strategy"], sorted(SEARCH_STRATEGIES))
    for former in ("strategy", "mode"):  # its former names (tula_ray.planning.plan.FORMER_NAMES)
        if a[former] is not None:
            check_choice(former, a[former], sorted(SEARCH_STRATEGIES))
    check_mapping("strategy_options", a["strategy_options"])
    check_number("measure_seconds", a["measure_seconds"], low=0.0)
    check_number("headroom", a["headroom"], low=0.0, high=1.0, high_open=True)
    check_number("device_memory_gb", a["device_memory_gb"], low=0.0, low_open=True,
                  optional=True)
    check_int("min_batch", a["min_batch"], minimum=1)
    check_int("max_batch", a["max_batch"], minimum=1, optional=True)
    check_int("warmup_steps", a["warmup_steps"], minimum=0)
    check_int("measure_steps", a["measure_steps"], minimum=1)
    check_int("epochs", a["epochs"], minimum=1, optional=True)
    # the plan's context's checks (its epochs are the workload's when None)
    check_plan_values(**{name: a[name] for name in ("objective", "collective", "weight_time",
                                                    "reference_batch", "noise_scale")})
    check_mapping("workload_options", a["workload_options"])
    check_mapping("training_options", a["training_options"])
    for label in ("storage_path", "name", "address"):
        check_text(label, a[label], optional=True)
    check_bool("resume", a["resume"])
    check_verbose(a["verbose"])
    if a["resume"] and a["name"] is None:
        raise ValueError("resume=True needs name=: the name of the search to continue (with "
                         "the same storage_path); a search without a name gets a new one")
    check_worker_request(a["resources_per_worker"], a["provision_timeout_s"])
    check_runtime_env(a["runtime_env"])


def check_request(r: "SearchRequest") -> None:
    """What depends on several arguments or on the workload."""
    # An unknown name or option fails here.
    named_arguments(make_search_strategy, "search_strategy", "strategy_options")(
        r.search_strategy, r.strategy_options)
    if r.training_strategy is not None:
        strategy = named_arguments(get_training_strategy, "training_strategy")(r.training_strategy)
        named_arguments(check_option_names, "training_options")(strategy, r.training_options)
        # A strategy that cannot train the workload's optimizer (LARS: an SGD) is refused
        # here, not after the search has profiled it.
        check_base_optimizer(strategy, r.workload.optimizer_fn, r.workload.name)
    if r.max_batch is not None and r.max_batch < r.min_batch:
        raise ValueError(f"max_batch={r.max_batch} is below min_batch={r.min_batch}; "
                         "max_batch must be >= min_batch")


def check_dataset_size(r: "SearchRequest") -> None:
    """What depends on the training set's size, once the check on a worker knows it."""
    check_batch_in_dataset("min_batch", r.min_batch, r.workload.name, r.workload.dataset_size)


@dataclass(frozen=True)
class SearchRequest:
    """The user's arguments to `search`, validated, as one value."""

    spec: str | Workload  # what workers rebuild the workload from (a name, or the object)
    options: dict[str, Any]  # ... and its options (a built-in's, its precision included)
    workload_options: dict[str, Any]  # the options as the user gave them: the plan's record
    workload: Workload  # completed by the check on a worker (`_checked`)
    cluster_sizes: tuple[int, ...]
    min_batch: int
    max_batch: int | None
    objective: str
    search_strategy: str
    strategy_options: dict[str, Any]  # the search strategy's
    pricing: Pricing
    weight_time: float
    device_memory_gb: float | None
    headroom: float
    collective: str
    warmup_steps: int
    measure_steps: int
    storage_path: str | None
    name: str | None
    epochs: int
    measure_seconds: float
    provision_timeout_s: float
    training_strategy: str | TrainingStrategy | None
    training_options: dict[str, Any]
    reference_batch: int  # M0 of the plan's time to accuracy
    noise_scale: float | None  # the user's phi at the target; None: the profiles'

    @property
    def training_strategy_name(self) -> str | None:
        strategy = self.training_strategy
        return strategy.name if isinstance(strategy, TrainingStrategy) else strategy


def search_request(a: Mapping[str, Any]) -> SearchRequest:
    """`search`'s arguments (its locals, checked by `check_search_arguments`, the search
    strategy its own once its former names are resolved) as one request, checked
    (`check_request`)."""
    options = dict(a["workload_options"] or {})
    # The workload is completed (shapes, dtype, size) by a check where the workers run,
    # once Ray is up: the driver may lack the data the workers read.
    resolved = named_arguments(resolve_workload, "workload", "workload_options")(
        a["workload"], options)
    spec, sent_options, resolved = in_precision(a["workload"], options, resolved,
                                                a["precision"])
    request = SearchRequest(
        spec=spec, options=sent_options, workload_options=options, workload=resolved,
        cluster_sizes=tuple(sorted(set(a["cluster_sizes"]))),
        min_batch=a["min_batch"], max_batch=a["max_batch"], objective=a["objective"],
        search_strategy=a["search_strategy"], strategy_options=dict(a["strategy_options"] or {}),
        pricing=named_arguments(parse_pricing, "pricing")(a["pricing"]),
        weight_time=a["weight_time"], device_memory_gb=a["device_memory_gb"],
        headroom=a["headroom"], collective=a["collective"], warmup_steps=a["warmup_steps"],
        measure_steps=a["measure_steps"], storage_path=a["storage_path"], name=a["name"],
        epochs=resolved.epochs if a["epochs"] is None else a["epochs"],
        measure_seconds=a["measure_seconds"], provision_timeout_s=a["provision_timeout_s"],
        training_strategy=a["training_strategy"],
        training_options=dict(a["training_options"] or {}),
        reference_batch=a["reference_batch"], noise_scale=a["noise_scale"])
    check_request(request)
    return request


def json_options(options: dict[str, Any]) -> dict[str, Any]:
    """The workload options a plan can record, so `tula_ray.train(plan)` rebuilds the same
    workload (e.g. the same train_subset); functions (loss_fn, ...) cannot go into JSON."""
    kept = {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool, type(None)))}
    if len(kept) < len(options):
        logger.warning("the plan does not record workload options %s (not JSON); pass them "
                       "again to tula_ray.train(..., workload_options=...)",
                       sorted(set(options) - set(kept)))
    return kept


def search_identity(request: SearchRequest) -> dict[str, Any]:
    """The arguments that define a search, as JSON (what a resume must match)."""
    return {"workload": request.workload.name, "cluster_sizes": list(request.cluster_sizes),
            "min_batch": request.min_batch, "max_batch": request.max_batch,
            # "strategy": its key in the searches saved so far, which a resume compares
            "strategy": request.search_strategy, "strategy_options": request.strategy_options,
            "objective": request.objective,
            "training_strategy": request.training_strategy_name,
            "training_options": json_options(request.training_options)}
