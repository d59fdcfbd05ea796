"""The Plan: what a search measured, what the models predict for every candidate, the choice.

`build_plan` is the whole modelling pipeline after profiling (DESIGN step 4):
fit the performance model (full or partial), predict step time, training time
(eq. 4a), peak memory (eq. 3) and cost (eq. 4b) for every (N, B) of the space,
apply the constraints (the table of candidates: `tula_ray.planning.candidates`), and let
the policy choose on the estimates (`tula_ray.planning.estimates`: measured where
profiled, predicted elsewhere). It needs no cluster, so a plan can be re-made offline
from recorded profiles.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tula_ray.failures import describe_errors
from tula_ray.models import memory as memory_model, perf
from tula_ray.models.batch_limit import BatchLimit
from tula_ray.models.pricing import NodeBilling, pricing_to_dict
from tula_ray.planning.accuracy import ProfiledNoise, add_time_to_accuracy, profiled_noise
from tula_ray.planning.adaptive_batch import memory_bound
from tula_ray.planning.adaptive_rows import adaptive_meta, adaptive_prediction, choose_adaptive
from tula_ray.planning.candidates import add_feasibility, candidate_table
from tula_ray.planning.context import PlanContext
from tula_ray.planning.estimates import (EpochCosts, add_estimates, add_uncertainty,
                                         dense_curve, strategy_extra_by_n, through_measurements)
from tula_ray.planning.noise_checks import choose_to_accuracy
from tula_ray.planning.policy import ACCURACY_OBJECTIVES, Choice
from tula_ray.planning.search_strategies import (SEARCH_STRATEGY_DEFAULT, make_search_strategy,
                                                 topology_options)
from tula_ray.planning.summary import (choice_line, compact_table, noise_lines,
                                      rows_that_matter, search_cost_line, shown_rows_line,
                                      strategy_cost_line, wrapped)
from tula_ray.profile_table import profile_frame, usable
from tula_ray.space import SearchSpace

PLAN_FORMAT = 1
# What the plan says of each candidate's way to the target accuracy (issue 25)
ACCURACY_COLUMNS = ("noise_scale", "efficiency", "epochs_to_target", "time_to_accuracy_s",
                    "cost_to_accuracy_usd")
KEYWORDS_REMOVED_IN = "0.3.0"  # build_plan's context as keywords (context= since issue 42)
# search_strategy='s former names, on build_plan and search (search_strategy= since issue 42):
# strategy= (train's strategy is the training strategy) and mode= (Ray's mode is min/max).
FORMER_NAMES_REMOVED_IN = "0.3.0"
FORMER_NAMES = {"strategy": "train's strategy is the training strategy",
                "mode": "Ray's mode means min/max"}


@dataclass
class Plan:
    """Result of a search: profiles, fitted models, one row per candidate, and the choice.

    adaptive: one row per N, the adaptive run at N (issue 44: `planning.adaptive_rows`),
    predicted over the noise scale trajectory in meta["noise_trajectory"]; empty where the
    plan has no noise scale, and in plans written before them."""

    workload: str
    # the search strategy (tula_ray.planning.search_strategies) that chose the fitted rows
    search_strategy: str
    objective: str
    epochs: int
    dataset_size: int
    profiles: pd.DataFrame
    perf: perf.PerfParams
    memory: memory_model.MemoryParams | None
    pricing: dict[str, Any]
    table: pd.DataFrame
    choice: Choice
    meta: dict[str, Any] = field(default_factory=dict)
    adaptive: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def strategy(self) -> str:
        """The former name of `search_strategy` (deprecated, removed in tula-ray 0.3.0)."""
        warnings.warn("Plan.strategy is deprecated and will be removed in tula-ray "
                      f"{FORMER_NAMES_REMOVED_IN}: use Plan.search_strategy (a plan's strategy "
                      "is its search strategy; train's is the training strategy)",
                      FutureWarning, stacklevel=2)
        return self.search_strategy

    @property
    def chosen(self) -> pd.Series:
        """The table row of the chosen candidate; of an adaptive choice, the row of the
        batch it starts at with the adaptive row's figures over it (its time and cost to
        the target, its epochs, its batches)."""
        match = self.table[(self.table["num_workers"] == self.choice.num_workers)
                           & (self.table["global_batch"] == self.choice.global_batch)]
        if not self.choice.adaptive or self.adaptive.empty:
            return match.iloc[0]
        row = self.adaptive[self.adaptive["num_workers"] == self.choice.num_workers]
        return pd.Series({**match.iloc[0].to_dict(), **row.iloc[0].to_dict()})

    @property
    def epochs_to_train(self) -> int:
        """The epochs `train` runs by default (issue 41, item 3): under an objective to an
        accuracy, the choice's `epochs_to_target` rounded up, the epochs its time to accuracy
        counts; under any other, the plan's `epochs`, those its total time counts."""
        if self.objective in ACCURACY_OBJECTIVES and "epochs_to_target" in self.table:
            to_target = float(self.chosen["epochs_to_target"])
            if np.isfinite(to_target):
                # a hair under a whole epoch is that epoch, not one more
                return max(1, math.ceil(to_target - 1e-9))
        return self.epochs

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "workload": self.workload,
            "strategy": self.search_strategy,  # the search strategy's key since format 1
            "objective": self.objective,
            "epochs": self.epochs,
            "dataset_size": self.dataset_size,
            "profiles": _frame_to_json(self.profiles),
            "perf": self.perf.to_dict(),
            "memory": None if self.memory is None else self.memory.to_dict(),
            "pricing": self.pricing,
            "table": _frame_to_json(self.table),
            "choice": self.choice.to_dict(),
            "meta": self.meta,
            "adaptive": _frame_to_json(self.adaptive),
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """The plan as JSON (no pickle); also written to `path` when given."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, source: str | Path) -> "Plan":
        """A plan from a JSON string or from the path of a file written by `to_json`."""
        text = str(source)
        if not text.lstrip().startswith("{"):
            text = Path(source).read_text()
        data = json.loads(text)
        if data.get("format") != PLAN_FORMAT:
            raise ValueError(f"plan format {data.get('format')!r} is not supported; "
                             f"this tula-ray reads format {PLAN_FORMAT}")
        return cls(
            workload=data["workload"],
            search_strategy=data.get("strategy", data.get("mode")),  # mode: before "strategy"
            objective=data["objective"],
            epochs=data["epochs"], dataset_size=data["dataset_size"],
            profiles=_frame_from_json(data["profiles"]),
            perf=perf.PerfParams.from_dict(data["perf"]),
            memory=None if data["memory"] is None
            else memory_model.MemoryParams.from_dict(data["memory"]),
            pricing=data["pricing"], table=_frame_from_json(data["table"]),
            choice=Choice.from_dict(data["choice"]), meta=data["meta"],
            # plans written before the adaptive rows (issue 44) have none
            adaptive=_frame_from_json(data["adaptive"]) if "adaptive" in data
            else pd.DataFrame(),
        )

    def plot(self, directory: str | Path) -> list[Path]:
        """PNG figures of predicted/measured time and cost vs B per N (paper Fig. 9/10)."""
        from tula_ray.planning.plotting import plot_plan  # matplotlib only when plotting

        return plot_plan(self, Path(directory))

    def describe_strategy_cost(self) -> str:
        """What the training times include of the training strategy's own cost per step."""
        return strategy_cost_line(self.meta, self.profiles, self.table)

    def summary(self, all_rows: bool = False) -> str:
        """The candidates and the choice as a person reads them, in lines of at most 100
        characters (`tula_ray.planning.summary`): a table of the figures that matter (N, B,
        b, step, epoch and training times, time to the target, cost, peak memory, measured
        or predicted, a note); of a plan of many candidates, only the choice, its ties and
        the best of each N unless `all_rows`. Every column of every candidate is in
        `table` and the plan's JSON."""
        c = self.choice
        shown = self.table if all_rows else rows_that_matter(self.table, c, self.objective)
        loo = self.perf.loo_median_rel_error
        lines = [
            compact_table(shown, c, self.objective),
            "" if len(shown) == len(self.table)
            else shown_rows_line(len(shown), len(self.table)),
            f"performance model: {self.search_strategy} search's fit, {self.perf.form} form, "
            f"{self.perf.num_profiles} profiles, leave-one-out error "
            + ("n/a" if loo is None else f"{loo:.1%}"),
            choice_line(c),
            c.describe_ties(),
            self.describe_strategy_cost(),
            EpochCosts.of_plan(self.profiles, self.meta, self.perf).describe(),
        ]
        lines += noise_lines(self.meta, self.adaptive)
        if self.meta.get("noise_warning"):
            lines.append(f"warning: {self.meta['noise_warning']}")
        if "trainable" in self.table and not self.table["trainable"].all():
            refused = self.table[~self.table["trainable"]]
            named = ", ".join(f"N={n} B={b}" for n, b in zip(refused["num_workers"],
                                                              refused["global_batch"]))
            lines.append(f"{self.meta.get('training_strategy') or 'the training strategy'} "
                         f"cannot train {named} (see infeasible_reason); the choice skips them")
        if self.meta.get("batch_limit"):
            lines.append("warning: candidates at local batch >= "
                         f"{self.meta['batch_limit']['local_batch']} are "
                         f"{BatchLimit.from_dict(self.meta['batch_limit']).reason()}")
        if self.meta.get("stop_reason"):
            lines.append(f"search stopped: {self.meta['stop_reason']}")
        lines.append(search_cost_line(self.meta.get("search_cost")))
        if self.meta.get("errors"):
            lines.append(f"errors while profiling, each once:\n"
                         f"{describe_errors(self.meta['errors'])}")
        return wrapped(lines)


def _frame_to_json(frame: pd.DataFrame) -> dict[str, Any]:
    records = frame.astype(object).where(frame.notna(), None).to_numpy().tolist()
    return {"columns": list(frame.columns),
            "dtypes": {c: str(t) for c, t in frame.dtypes.items()}, "data": records}


def _frame_from_json(data: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(data["data"], columns=data["columns"])
    for column, dtype in data["dtypes"].items():
        frame[column] = frame[column].astype("float64" if dtype == "float64" else dtype)
    return frame


# --- building a plan ------------------------------------------------------------

def fit_memory_from_profiles(profiles: pd.DataFrame) -> memory_model.MemoryParams | None:
    """The memory model from the profiles' own peaks, when they span >= 2 local batches."""
    rows = usable(profiles).dropna(subset=["peak_mem_bytes"])
    rows = rows[rows["peak_mem_bytes"] > 0]
    if rows["local_batch"].nunique() < 2:
        return None
    return memory_model.fit(rows["local_batch"], rows["peak_mem_bytes"])


def build_plan(
    space: SearchSpace,
    profiles: pd.DataFrame,
    context: PlanContext | None = None,
    *,
    search_strategy: str = SEARCH_STRATEGY_DEFAULT,
    meta: dict[str, Any] | None = None,
    strategy: str | None = None,
    mode: str | None = None,
    **keywords: Any,
) -> Plan:
    """Fit, predict every candidate of `space`, apply constraints, choose (DESIGN step 4).

    context: everything the plan needs beyond the space and the rows: the epochs and
      dataset size it predicts, the objective and pricing, the memory bound, ... (see
      `tula_ray.planning.context.PlanContext`, checked when built). `**keywords`, the
      same values as keywords of build_plan (epochs=, dataset_size=, objective=, ...),
      are its former, deprecated form (removed in tula-ray 0.3.0).
    search_strategy: the search strategy whose rows the model is fitted from (`fit_rows`:
      full, every usable row; partial, the corners), see tula_ray.planning.search_strategies.
    strategy, mode: its former names (deprecated, removed in tula-ray 0.3.0).
    meta: what the plan records beside (the search's timings, ...); the plan adds its
      context (meta["plan_context"]), reference batch, workers per node and noise.
    """
    search_strategy = renamed_search_strategy(search_strategy, strategy, mode)
    context = _context_of(context, keywords)
    profiles = profile_frame(profiles.to_dict("records"))
    params, memory = _fitted_models(profiles, context, search_strategy)
    extra = strategy_extra_by_n(profiles)  # the training strategy's measured cost per step
    # evaluation, checkpoint, start-up (with the probe's check of the workload): measured
    costs = EpochCosts.of_plan(profiles, {**(meta or {}), "plan_context": context.to_dict()},
                               params)
    billing = NodeBilling(context.pricing, context.workers_per_node)  # costs in whole nodes
    table = candidate_table(space, profiles, params, memory, billing, costs, extra, context)
    predicted_u = add_uncertainty(table, profiles, params)
    # The model's own limit, found by the search's memory probe (meta["batch_limit"]).
    limit = (meta or {}).get("batch_limit")
    oom_bound = add_feasibility(table, profiles, context,
                                None if limit is None else BatchLimit.from_dict(limit))
    estimates = add_estimates(table, billing)
    noise = _add_time_to_accuracy(table, estimates, profiles, context, billing)
    bound = memory_bound(oom_bound, None if limit is None
                         else BatchLimit.from_dict(limit).local_batch, context.max_local_batch)
    adaptive, trajectory = adaptive_prediction(estimates, profiles, noise, context, params,
                                               memory, billing, bound)
    half_data = context.dataset_size // 2  # the knee's curve stops where the candidates do
    dense = dense_curve(space, params, memory, billing, context.epochs, context.dataset_size,
                        oom_bound, context.max_local_batch, context.max_workers,
                        half_data if context.max_global_batch is None
                        else min(context.max_global_batch, half_data),
                        extra, costs, set(context.plain_steps))
    dense = through_measurements(dense, table, billing)
    add_time_to_accuracy(dense, noise, context.reference_batch, context.epochs, billing,
                         dataset_size=context.dataset_size)
    choice, noise_warning = _choose(estimates, noise, dense, predicted_u, context, adaptive)
    meta = {**dict(meta or {}), "plan_context": context.to_dict(),
            "reference_batch": context.reference_batch,
            "workers_per_node": context.workers_per_node, "noise": noise.to_dict(),
            **({"noise_warning": noise_warning} if noise_warning else {}),
            **adaptive_meta(trajectory, bound)}
    return Plan(context.workload, search_strategy, context.objective, context.epochs,
                context.dataset_size, profiles, params, memory, pricing_to_dict(context.pricing),
                table, choice, meta, adaptive)


def _add_time_to_accuracy(table: pd.DataFrame, estimates: pd.DataFrame,
                          profiles: pd.DataFrame, context: PlanContext,
                          billing: NodeBilling) -> ProfiledNoise:
    """Each candidate's way to the target (`ACCURACY_COLUMNS`) on its estimates, in
    `estimates` and `table` alike; returns the profiled noise they rest on."""
    noise = profiled_noise(profiles, context.noise_calibration, context.noise_scale)
    add_time_to_accuracy(estimates, noise, context.reference_batch, context.epochs, billing,
                         peak_column="estimated_peak_mem_bytes",
                         dataset_size=context.dataset_size)
    for column in ACCURACY_COLUMNS:
        table[column] = estimates[column]
    return noise


def _fitted_models(profiles: pd.DataFrame, context: PlanContext, search_strategy: str
                   ) -> tuple[perf.PerfParams, memory_model.MemoryParams | None]:
    """Eq. 2 fitted on the rows the search strategy fits from (full: every usable row;
    partial: the corners), and eq. 3: the context's (the memory probe's), else the
    profiles' own peaks; memory-based pricing needs one."""
    workers_per_node = context.workers_per_node
    rows = make_search_strategy(search_strategy,
                                topology_options(search_strategy, None, workers_per_node)
                                ).fit_rows(profiles)
    params = perf.fit(rows, collective=context.collective, form=context.form,
                      strategy=search_strategy, workers_per_node=workers_per_node)
    memory = context.memory if context.memory is not None else fit_memory_from_profiles(profiles)
    if memory is None and "memory" in pricing_to_dict(context.pricing)["kind"]:
        raise ValueError("memory-based pricing needs a memory model: profile at least two "
                         "local batch sizes with peak_mem_bytes, or pass memory=")
    return params, memory


def _choose(estimates: pd.DataFrame, noise: ProfiledNoise, dense: pd.DataFrame,
            predicted_u: Any, context: PlanContext,
            adaptive: pd.DataFrame) -> tuple[Choice, str | None]:
    """The policy's choice on the estimates and the dense curve (with the noise checks'
    warning, if any), or an adaptive row that beats it (`choose_adaptive`), its reason
    naming where the choice's own figures come from."""
    choice, noise_warning = choose_to_accuracy(
        estimates, context.objective, noise, context.dataset_size, dense=dense,
        weight_time=context.weight_time, uncertainty="rel_uncertainty",
        dense_uncertainty=predicted_u)
    choice = choose_adaptive(choice, estimates, adaptive, context.objective,
                             context.adaptive_batch)
    source = estimates.loc[(estimates["num_workers"] == choice.num_workers)
                           & (estimates["global_batch"] == choice.global_batch), "estimate"]
    source = ("integrated from the estimates of its batches over the noise scale "
              "trajectory" if choice.adaptive else source.iloc[0])
    choice = replace(choice, reason=f"{choice.reason}; the choice's own figures are {source}")
    return choice, noise_warning


def _context_of(context: PlanContext | None, keywords: dict[str, Any]) -> PlanContext:
    """`context`, or the context of build_plan's former keywords, with a FutureWarning."""
    if not keywords:
        if context is None:
            raise TypeError("build_plan needs context=PlanContext(epochs=..., "
                            "dataset_size=..., ...): the training the plan predicts")
        return context
    if context is not None:
        raise TypeError(f"build_plan takes context= or its keywords, not both: put "
                        f"{sorted(keywords)} in the PlanContext")
    warnings.warn("build_plan's keywords (epochs=, dataset_size=, objective=, ...) are "
                  "deprecated and will be removed in tula-ray "
                  f"{KEYWORDS_REMOVED_IN}: pass context=tula_ray.PlanContext(...) with the "
                  "same keywords", FutureWarning, stacklevel=3)
    return PlanContext(**keywords)


def renamed_search_strategy(search_strategy: str, strategy: str | None = None,
                            mode: str | None = None) -> str:
    """`search_strategy`, or the one a former name gives (`FORMER_NAMES`, with a
    FutureWarning naming the caller's line). A former name beside a search_strategy other
    than the default, or both former names: a TypeError (one search strategy, one name)."""
    former = {name: value for name, value in (("strategy", strategy), ("mode", mode))
              if value is not None}
    if not former:
        return search_strategy
    if len(former) > 1 or search_strategy != SEARCH_STRATEGY_DEFAULT:
        given = ({} if search_strategy == SEARCH_STRATEGY_DEFAULT
                 else {"search_strategy": search_strategy}) | former
        raise TypeError(", ".join(f"{name}={value!r}" for name, value in given.items())
                        + " all name the search strategy: pass search_strategy= alone")
    [(name, value)] = former.items()
    warnings.warn(f"`{name}=` is deprecated and will be removed in tula-ray "
                  f"{FORMER_NAMES_REMOVED_IN}: use search_strategy= ({FORMER_NAMES[name]})",
                  FutureWarning, stacklevel=3)
    return value


