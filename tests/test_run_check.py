"""The plan beside a run of its choice (issue 43): `tula_ray.planning.run_check`. Pure logic:
a plan from synthetic profiles, a run's metrics made up."""

import math

import numpy as np
import pandas as pd
import pytest
from paper_profiles import paper_profiles as synthetic_profiles

from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import build_plan
from tula_ray.planning.run_check import (Planned, against_plan, against_plan_line,
                                         planned_for_run)
from tula_ray.planning.synthetic import example_params
from tula_ray.planning.target_costs import TargetEvaluations
from tula_ray.space import SearchSpace

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
DATASET, TEST = 10_000, 2_000


def plan_of(**columns):
    profiles = synthetic_profiles(SPACE.candidates(), example_params(), seed=3).assign(**columns)
    return build_plan(SPACE, profiles, PlanContext(epochs=3, dataset_size=DATASET,
                                                   objective="time"), search_strategy="full")


def test_the_plans_step_is_its_measured_epoch_over_its_steps():
    plan = plan_of(eval_time_s=0.4, eval_samples=float(TEST))
    row = plan.table[(plan.table["num_workers"] == 2) & (plan.table["global_batch"] == 64)].iloc[0]
    planned = planned_for_run(plan, 2, 64, to_target=False)
    assert row["source"] == "measured"
    assert planned.step_s == pytest.approx(row["measured_epoch_time_s"] / (DATASET // 64))
    assert planned.evaluation_s == pytest.approx(row["eval_time_s"])
    to_target = planned_for_run(plan, 2, 64, to_target=True)
    target = TargetEvaluations(DATASET, 1000, TEST)
    assert to_target.evaluation_s == pytest.approx(
        target.passes_per_epoch(np.array([64]))[0] * 0.9 * row["eval_time_s"] * 1000 / TEST)
    assert planned_for_run(plan, 2, 48, to_target=False) is None  # no such row
    unmeasured = planned_for_run(plan_of(), 2, 64, to_target=False)
    assert math.isnan(unmeasured.evaluation_s)


def test_the_run_is_read_after_its_first_epoch_on_whole_epochs():
    planned = Planned(step_s=0.01, evaluation_s=0.5, to_target=True)
    metrics = pd.DataFrame({"epoch": [0, 1, 2, 3], "steps": [100, 100, 100, 40],
                            "seconds": [3.0, 1.2, 1.0, 0.3],
                            "val_seconds": [0.9, 0.4, 0.6, 0.1]})
    frame = against_plan(planned, metrics).set_index("what")
    # epochs 1 and 2: the first warms up, the last stopped at its target part-way
    assert frame.loc["training s per epoch", "measured"] == pytest.approx(1.1)
    assert frame.loc["training s per epoch", "planned"] == pytest.approx(1.0)
    assert frame.loc["evaluation s per epoch", "measured"] == pytest.approx(0.5)
    assert frame.loc["evaluation s per epoch", "ratio"] == pytest.approx(1.0)
    line = against_plan_line(against_plan(planned, metrics))
    assert "training s per epoch 1.1, planned 1 (0.91x)" in line
    one_epoch = against_plan(Planned(0.01, math.nan, False), metrics.iloc[:1])
    assert list(one_epoch["what"]) == ["training s per epoch"]  # no pass planned
    assert one_epoch["measured"].iloc[0] == 3.0  # a single epoch: that one
