"""A run to a target's evaluations in the plan's time to accuracy (issue 43, item 1):
validation passes every quarter epoch, priced from the profiled test pass by samples, and
the test pass once, instead of a test pass per epoch. Pure logic: no Ray."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, strategies as st
from paper_profiles import paper_profiles as synthetic_profiles
from result_checks import summary_words

from tula_ray.evaluation_schedule import held_out_size
from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import build_plan
from tula_ray.planning.synthetic import example_params
from tula_ray.planning.target_costs import TargetEvaluations
from tula_ray.space import SearchSpace

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=1024)
EPOCHS, DATASET, TEST = 5, 10_000, 2_000
EVAL_S, CHECKPOINT_S = 0.8, 0.1  # the profiled test pass at N = 1, a checkpoint write


def profiles(**columns):
    """Every candidate profiled, with noise, a test pass of TEST samples at N = 1 (half of
    it on each of two workers), a checkpoint write and a start-up."""
    frame = synthetic_profiles(SPACE.candidates(), example_params(), seed=2).assign(
        grad_sqr=1.0, grad_var=100.0, noise_steps=4, checkpoint_time_s=CHECKPOINT_S,
        launch_wall_s=5.0, data_load_s=0.0, **columns)
    frame["eval_time_s"] = EVAL_S / frame["num_workers"]
    return frame


def plan_of(frame, objective="time_to_accuracy"):
    context = PlanContext(epochs=EPOCHS, dataset_size=DATASET, objective=objective,
                          noise_calibration=1.0)
    return build_plan(SPACE, frame, context, search_strategy="full")


def test_passes_per_epoch_follow_trains_quarter_epoch_interval():
    """D = 10000 less a 1000-sample split: 9000 trained an epoch; at B = 32, 281 steps,
    an evaluation every 70 (2240 samples): 10000 / 2240 passes per 10000 samples."""
    evaluations = TargetEvaluations(DATASET, held_out_size(DATASET, 0.1), TEST)
    assert evaluations.train_size == 9000
    assert evaluations.passes_per_epoch(np.array([32, 1024])) == pytest.approx(
        [DATASET / (70 * 32), DATASET / (2 * 1024)])
    own = TargetEvaluations(DATASET, 500, TEST, held_out=False)  # the workload's own split
    assert own.train_size == DATASET
    assert own.passes_per_epoch(np.array([32]))[0] == pytest.approx(DATASET / (78 * 32))


@given(dataset=st.integers(100, 200_000), batch=st.integers(1, 4096))
def test_about_four_passes_an_epoch_of_its_own(dataset, batch):
    evaluations = TargetEvaluations(dataset, held_out_size(dataset, 0.1), 1000)
    assume(batch * 40 <= evaluations.train_size)  # 40 steps an epoch: whole steps matter less
    per_own_epoch = evaluations.passes_per_epoch(np.array([batch]))[0] * (
        evaluations.train_size / dataset)
    assert 4.0 * (1 - 1e-9) <= per_own_epoch < 4.5


def test_the_time_to_accuracy_prices_the_run_to_a_target():
    """Each row by hand: the epoch's steps, its validation passes (the test pass's price
    per sample times the split's samples) and a checkpoint per epoch of 9000 samples, then
    the start-up and the test pass once."""
    plan = plan_of(profiles(eval_samples=float(TEST)))
    evaluations = TargetEvaluations(DATASET, 1000, TEST)
    for _, row in plan.table.iterrows():
        n, b = int(row["num_workers"]), int(row["global_batch"])
        passes = evaluations.passes_per_epoch(np.array([b]))[0]
        epoch = (row["estimated_total_time_s"] - row["startup_time_s"]) / EPOCHS \
            - row["eval_time_s"] - CHECKPOINT_S
        per_epoch = epoch + passes * (EVAL_S / n) * 1000 / TEST + CHECKPOINT_S * 10 / 9
        assert row["time_to_accuracy_s"] == pytest.approx(
            row["epochs_to_target"] * per_epoch + row["startup_time_s"] + EVAL_S / n)
    assert "a run to a target (train's defaults): a 1000-sample validation pass" in \
        summary_words(plan)


def test_the_workloads_own_split_is_priced_at_its_size_and_trains_on_all_of_d():
    plan = plan_of(profiles(eval_samples=float(TEST), validation_samples=3000.0))
    row = plan.table.iloc[0]
    evaluations = TargetEvaluations(DATASET, 3000, TEST, held_out=False)
    passes = evaluations.passes_per_epoch(np.array([row["global_batch"]]))[0]
    assert row["target_extra_s"] == pytest.approx(
        passes * row["eval_time_s"] * 3000 / TEST + CHECKPOINT_S)


def test_profiles_without_the_passs_samples_keep_a_test_pass_per_epoch():
    """Profiles recorded before the pass's samples (or without a test set): the time to
    accuracy is the fixed run's epochs scaled, as before, so that old plans replay alike."""
    plan = plan_of(profiles())
    assert "target_extra_s" not in plan.table
    for _, row in plan.table.iterrows():
        per_epoch = (row["estimated_total_time_s"] - row["startup_time_s"]) / EPOCHS
        assert row["time_to_accuracy_s"] == pytest.approx(
            row["epochs_to_target"] * per_epoch + row["startup_time_s"])


def test_the_adaptive_rows_price_the_same_evaluations():
    """An adaptive row over a constant phi is the best fixed batch (module adaptive_rows):
    with the target's pricing its time is that fixed row's time to accuracy."""
    plan = plan_of(profiles(eval_samples=float(TEST)))
    adaptive = plan.adaptive.set_index("num_workers")
    for n, row in adaptive.iterrows():
        fixed = plan.table[(plan.table["num_workers"] == n)
                           & (plan.table["global_batch"] == row["fixed_batch"])].iloc[0]
        assert row["fixed_time_to_accuracy_s"] == pytest.approx(
            fixed["time_to_accuracy_s"], rel=1e-6)
    assert not math.isnan(float(adaptive["time_to_accuracy_s"].min()))


def test_the_fixed_epoch_columns_are_unchanged():
    priced, before = plan_of(profiles(eval_samples=float(TEST))), plan_of(profiles())
    pd.testing.assert_series_equal(priced.table["total_time_s"], before.table["total_time_s"])


def test_the_target_eval_benchmark_sets_the_plans_price_beside_the_runs():
    """benchmarks/prediction/target_eval.py without Ray: a plan's price at a cell, the runs'
    median (epochs after the first), and the report's ratios."""
    from benchmarks.prediction import target_eval

    plan = plan_of(profiles(eval_samples=float(TEST)))
    price = target_eval.predicted(plan, 2, 64)
    evaluations = TargetEvaluations(DATASET, 1000, TEST)
    row = plan.table[(plan.table["num_workers"] == 2) & (plan.table["global_batch"] == 64)].iloc[0]
    per_run_epoch = evaluations.passes_per_epoch(np.array([64]))[0] * 9000 / DATASET
    assert price["passes"] == pytest.approx(per_run_epoch)
    assert price["plan_s"] == pytest.approx(per_run_epoch * row["eval_time_s"] * 1000 / TEST)
    assert price["before_s"] == row["eval_time_s"]
    runs = [{"cell": [2, 64], "repeat": 0, "val_seconds": [9.0, 1.0, 3.0]},
            {"cell": [2, 64], "repeat": 1, "val_seconds": [9.0, 2.0, 2.0]},
            {"cell": [1, 32], "repeat": 0, "val_seconds": [9.0, 7.0]}]
    assert target_eval._measured(runs, (2, 64)) == 2.0
    with pytest.raises(RuntimeError, match="no pass's samples"):
        target_eval.predicted(plan_of(profiles()), 2, 64)
    result = {"command": "c", "commit": "x", "date": "d", "machine": "m",
              "settings": {**target_eval.FULL, "target": target_eval.TARGET},
              "rows": [{"num_workers": 2, "global_batch": 64, **price, "train_s": 2.0,
                        "runs": 2}]}
    text = target_eval.report(result)
    assert f"| 2 | 64 | {per_run_epoch:.2f} | 2 | 2.000 |" in text
    assert f"{price['plan_s'] / 2.0:.2f}" in text
