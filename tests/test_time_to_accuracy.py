"""The plan's time to accuracy (issue 25, item 2): the profiled gradient noise, the epochs
each batch needs to reach what the workload's epochs reach at the reference batch, and
the objectives that rank on it. Pure logic: no Ray."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st
from paper_profiles import paper_profiles as synthetic_profiles
from result_checks import summary_words

from tula_ray.planning.accuracy import (ProfiledNoise, epochs_to_target, profiled_noise,
                                        weighted_standard_error, whole_step_epochs)
from tula_ray.planning.context import PlanContext
from tula_ray.planning.noise_checks import NoiseScaleWarning
from tula_ray.planning.plan import ACCURACY_COLUMNS, Plan, build_plan
from tula_ray.planning.policy import choose, find_knee
from tula_ray.planning.synthetic import example_params
from tula_ray.profile_table import profile_frame
from tula_ray.space import SearchSpace

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=1024)
EPOCHS = 5


def profiles_with_noise(grad_sqr=1.0, grad_var=100.0, steps=4):
    """Every candidate profiled (full search), each row with the same gradient noise."""
    profiles = synthetic_profiles(SPACE.candidates(), example_params(), seed=2)
    return profiles.assign(grad_sqr=grad_sqr, grad_var=grad_var, noise_steps=steps)


def make_plan(profiles=None, **kwargs):
    options = dict(epochs=EPOCHS, dataset_size=10000, objective="time", noise_calibration=1.0)
    options.update(kwargs)
    strategy, meta = options.pop("strategy", "full"), options.pop("meta", None)
    return build_plan(SPACE, profiles_with_noise() if profiles is None else profiles,
                      PlanContext(**options), search_strategy=strategy, meta=meta)


def test_profiled_noise_pools_the_ok_rows_by_their_steps():
    rows = profile_frame([
        {"num_workers": 1, "global_batch": 32, "step_time_s": 0.1, "status": "ok",
         "grad_sqr": 1.0, "grad_var": 10.0, "noise_steps": 3},
        {"num_workers": 2, "global_batch": 64, "step_time_s": 0.1, "status": "ok",
         "grad_sqr": 3.0, "grad_var": 50.0, "noise_steps": 1},
        # no measurement, and a failed row: neither counts
        {"num_workers": 2, "global_batch": 128, "step_time_s": 0.1, "status": "ok"},
        {"num_workers": 2, "global_batch": 256, "status": "oom", "grad_sqr": 99.0,
         "grad_var": 1.0, "noise_steps": 5},
    ])
    noise = profiled_noise(rows, calibration=2.0)
    assert (noise.steps, noise.rows) == (4, 2)
    assert noise.grad_sqr == pytest.approx((3 * 1.0 + 3.0) / 4)
    assert noise.grad_var == pytest.approx((3 * 10.0 + 50.0) / 4)
    assert noise.noise_scale == pytest.approx(2.0 * 20.0 / 1.5)


def test_a_bad_calibration_is_refused_by_name():
    with pytest.raises(ValueError, match="noise_calibration=0"):
        profiled_noise(profiles_with_noise(), calibration=0)


@given(phi=st.floats(1.0, 1e5), epochs=st.integers(1, 100),
       batches=st.lists(st.integers(1, 1 << 14), min_size=2, max_size=8))
def test_epochs_to_target_grow_with_the_batch_and_equal_the_epochs_at_the_reference(
        phi, epochs, batches):
    batches = sorted(set(batches))
    needed = epochs_to_target(epochs, phi, np.array(batches), reference_batch=32)
    assert np.all(np.diff(needed) > 0)
    assert epochs_to_target(epochs, phi, np.array([32]), 32)[0] == pytest.approx(epochs)
    # steps to the target (epochs x D / B) never rise with B: a larger batch never takes
    # more steps, which is what makes it worth having (McCandlish et al. eq. 2.11)
    steps = needed / np.array(batches)
    assert np.all(np.diff(steps) <= 1e-12 * steps[:-1])


def test_whole_steps_count_the_samples_an_epoch_drops():
    """Issue 43, item 4: at B = 2048 on 10k samples an epoch is 4 steps, 8192 samples: the
    epochs to do the reference's work grow by 10000 // 32 x 32 / 8192."""
    assert whole_step_epochs(10_000, np.array([32, 2048]), 32) == pytest.approx(
        [1.0, 9984 / 8192])
    plain = epochs_to_target(5, 100.0, np.array([2048]), 32)
    whole = epochs_to_target(5, 100.0, np.array([2048]), 32, dataset_size=10_000)
    assert whole[0] == pytest.approx(plain[0] * 9984 / 8192)
    assert epochs_to_target(5, math.nan, np.array([2048]), 32, dataset_size=10_000)[0] == 5


@given(dataset=st.integers(64, 100_000), batch=st.integers(1, 4096))
def test_whole_steps_never_count_fewer_epochs_than_samples_do(dataset, batch):
    assume(batch <= dataset)
    factor = whole_step_epochs(dataset, np.array([batch]), 32)[0]
    counted_in_samples = (dataset // 32 * 32) / dataset  # an epoch of D samples at B
    assert factor >= counted_in_samples * (1 - 1e-12)
    if dataset % batch == 0:  # no sample dropped at B
        assert factor == pytest.approx(counted_in_samples)


def test_unknown_noise_keeps_the_workloads_epochs():
    assert np.all(epochs_to_target(7, math.nan, np.array([32, 1024]), 32) == 7)


def test_the_plan_counts_the_epochs_each_batch_needs():
    plan = make_plan()
    table = plan.table.set_index(["num_workers", "global_batch"])
    phi = 100.0  # grad_var / grad_sqr, calibration 1
    for (n, b), row in table.iterrows():
        assert row["noise_scale"] == pytest.approx(phi)
        assert row["efficiency"] == pytest.approx((phi + 32) / (phi + b))
        # in whole steps: an epoch at B is floor(D / B) steps (issue 43, item 4)
        whole = whole_step_epochs(plan.dataset_size, np.array([b]), 32)[0]
        assert row["epochs_to_target"] == pytest.approx(EPOCHS * (phi + b) / (phi + 32) * whole)
        per_epoch = (row["estimated_total_time_s"] - row["startup_time_s"]) / EPOCHS
        assert row["time_to_accuracy_s"] == pytest.approx(
            row["epochs_to_target"] * per_epoch + row["startup_time_s"])
    at_reference = table.xs(32, level="global_batch")
    assert np.allclose(at_reference["time_to_accuracy_s"],
                       at_reference["estimated_total_time_s"])
    assert plan.meta["reference_batch"] == 32
    assert plan.meta["noise"]["noise_scale"] == pytest.approx(phi)


@pytest.mark.parametrize("objective, column", [("time_to_accuracy", "time_to_accuracy_s"),
                                               ("cost_to_accuracy", "cost_to_accuracy_usd")])
def test_the_to_accuracy_objectives_choose_the_minimum_of_their_column(objective, column):
    plan = make_plan(objective=objective, profiles=profiles_with_noise(grad_var=40.0))
    feasible = plan.table[plan.table["feasible"]]
    best = feasible.loc[feasible[column].idxmin()]
    assert (plan.choice.num_workers, plan.choice.global_batch) == (
        best["num_workers"], best["global_batch"])
    assert plan.choice.objective == objective


def test_a_small_noise_scale_moves_the_choice_to_a_smaller_batch_than_fixed_epochs_do():
    # These profiles' step time falls with B, so fixed epochs favour the largest batch;
    # with phi = 40, a batch of 1024 needs 5 x 1064 / 72 = 74 epochs to do 5 epochs' work.
    noisy = profiles_with_noise(grad_var=40.0)
    fixed = make_plan(profiles=noisy, objective="time").choice
    to_accuracy = make_plan(profiles=noisy, objective="time_to_accuracy").choice
    assert to_accuracy.global_batch < fixed.global_batch


def test_all_noise_makes_every_batch_need_the_same_epochs():
    # a profile with no signal (|G|^2 <= 0, as random data gives): phi is infinite, the
    # plan warns and chooses by the rule that needs no phi
    with pytest.warns(NoiseScaleWarning, match="no signal.*measure_noise_scale"):
        plan = make_plan(profiles=profiles_with_noise(grad_sqr=-0.5),
                         objective="time_to_accuracy")
    assert "time_to_accuracy fell back to the knee rule" in plan.choice.reason
    assert np.allclose(plan.table["epochs_to_target"], EPOCHS)
    assert plan.table["noise_scale"].isna().all()
    again = Plan.from_json(plan.to_json())
    assert again.meta["noise"]["noise_scale"] is None
    assert "no signal measured" in summary_words(again)


def test_profiles_without_the_noise_give_the_fixed_epochs_and_say_so():
    plan = make_plan(profiles=synthetic_profiles(SPACE.candidates(), example_params(), seed=2))
    assert np.allclose(plan.table["time_to_accuracy_s"], plan.table["estimated_total_time_s"])
    assert "not measured" in summary_words(plan)


def test_the_plan_round_trips_its_time_to_accuracy(tmp_path):
    plan = make_plan(objective="knee_to_accuracy", reference_batch=64)
    again = Plan.from_json(plan.to_json(tmp_path / "plan.json"))
    for column in ACCURACY_COLUMNS:
        assert np.allclose(again.table[column], plan.table[column], equal_nan=True)
    assert again.meta["reference_batch"] == 64
    assert ProfiledNoise.from_dict(again.meta["noise"]).noise_scale == pytest.approx(100.0)
    text = summary_words(again)
    assert "target_s" in text and "gradient noise scale phi = 100" in text


def test_a_given_noise_scale_replaces_the_profiles_and_both_are_kept(tmp_path):
    """phi measured at the target (`noise_scale=`) sets every candidate's efficiency; the
    profiles' phi (100) stays recorded beside it, through the plan's JSON."""
    plan = make_plan(objective="time_to_accuracy", noise_scale=300.0)
    batches = plan.table["global_batch"].to_numpy(float)
    assert np.allclose(plan.table["efficiency"], (300.0 + 32) / (300.0 + batches))
    whole = whole_step_epochs(plan.dataset_size, batches, 32)
    assert np.allclose(plan.table["epochs_to_target"],
                       EPOCHS * (300.0 + batches) / 332.0 * whole)
    again = Plan.from_json(plan.to_json(tmp_path / "plan.json"))
    noise = ProfiledNoise.from_dict(again.meta["noise"])
    assert noise.noise_scale == 300.0 and noise.measured_noise_scale == pytest.approx(100.0)
    assert "phi = 300, given" in summary_words(again) and "measured 100" in summary_words(again)
    # a larger phi at the target: large batches cost fewer extra epochs, so the choice
    # moves to a batch at least as large as with the profiles' phi
    profiled = make_plan(objective="time_to_accuracy")
    assert plan.choice.global_batch >= profiled.choice.global_batch


def test_a_plan_written_before_the_given_noise_scale_still_loads():
    old = {"grad_sqr": 1.0, "grad_var": 100.0, "steps": 4, "rows": 14, "calibration": 1.0}
    noise = ProfiledNoise.from_dict(old)
    assert math.isnan(noise.given) and noise.noise_scale == pytest.approx(100.0)


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf"), "300"])
def test_a_bad_noise_scale_is_refused_by_name(bad):
    with pytest.raises((TypeError, ValueError), match="noise_scale"):
        make_plan(noise_scale=bad)


def test_a_bad_reference_batch_is_refused_by_name():
    with pytest.raises((TypeError, ValueError), match="reference_batch"):
        make_plan(reference_batch=0)


def test_the_to_accuracy_knee_is_on_the_falling_part_of_the_curve():
    # time to accuracy falls to B = 256, then rises: Kneedle on the whole curve would be
    # told it is not decreasing; on the falling part it finds where the fall flattens
    batches = np.array([32, 64, 128, 256, 512, 1024])
    seconds = np.array([100.0, 40.0, 25.0, 22.0, 30.0, 60.0])
    import pandas as pd
    table = pd.DataFrame({"num_workers": 1, "global_batch": batches, "feasible": True,
                          "total_time_s": seconds, "cost_usd": seconds,
                          "time_to_accuracy_s": seconds})
    choice = choose(table, "knee_to_accuracy")
    assert choice.global_batch in (64, 128)
    assert choice.global_batch <= choose(table, "time_to_accuracy").global_batch
    assert find_knee(batches[:4], seconds[:4]) is not None


def test_an_objective_on_a_column_the_table_lacks_names_it():
    import pandas as pd
    table = pd.DataFrame({"num_workers": [1], "global_batch": [32], "feasible": [True],
                          "total_time_s": [1.0], "cost_usd": [1.0]})
    with pytest.raises(ValueError, match="time_to_accuracy_s"):
        choose(table, "time_to_accuracy")


# --- a noise scale that cannot collapse (issue 41, item 2) --------------------------------

def _rows_with_signal(grad_sqr):
    """Full-search profiles whose rows measured these |G|^2 in turn (tr(Sigma) 100)."""
    profiles = profiles_with_noise()
    values = [grad_sqr[i % len(grad_sqr)] for i in range(len(profiles))]
    return profiles.assign(grad_sqr=values)


def test_negative_rows_are_kept_reported_and_phi_floored_at_the_standard_error():
    """The issue's collapse: two rows with a negative |G|^2 pull the pooled |G|^2 to ~0,
    and phi = tr(Sigma) / |G|^2 to 1e5 and more. Floored at its standard error, phi stays
    bounded; the plan warns by name, the rows are counted, and time_to_accuracy, which
    would rank the candidates by their time per epoch, falls back to the knee."""
    profiles = _rows_with_signal([-1.0, 1.0, -1.0, 1.0 + 1e-6])
    with pytest.warns(NoiseScaleWarning, match=r"negative \|G\|\^2.*no signal"):
        plan = make_plan(profiles=profiles, objective="time_to_accuracy")
    noise = ProfiledNoise.from_dict(plan.meta["noise"])
    assert noise.negative_rows == len(profiles) // 2 and not noise.has_signal
    assert noise.grad_sqr == pytest.approx(0.0, abs=1e-6)
    assert noise.measured_noise_scale == pytest.approx(100.0 / noise.grad_sqr_se)
    assert noise.measured_noise_scale < 1000  # not the 1e8 of the unfloored ratio
    assert "fell back to the knee rule" in plan.choice.reason
    assert plan.meta["noise_warning"] in summary_words(plan)
    assert "with a negative |G|^2" in summary_words(plan)


def test_a_clear_signal_neither_warns_nor_falls_back(recwarn):
    plan = make_plan(profiles=_rows_with_signal([0.9, 1.1]), objective="time_to_accuracy")
    assert not [w for w in recwarn if issubclass(w.category, NoiseScaleWarning)]
    assert "fell back" not in plan.choice.reason and "noise_warning" not in plan.meta


def test_a_phi_above_the_training_set_warns():
    with pytest.warns(NoiseScaleWarning, match="exceeds the training set"):
        make_plan(profiles=profiles_with_noise(grad_sqr=0.001, grad_var=100.0),
                  objective="time")


def test_a_phi_the_user_gave_is_kept_even_where_it_collapses_the_objective():
    with pytest.warns(NoiseScaleWarning, match="efficiency is within 5% of 1"):
        plan = make_plan(objective="time_to_accuracy", noise_scale=1e9, dataset_size=2**31)
    assert "fell back" not in plan.choice.reason


@given(values=st.lists(st.floats(-10, 10), min_size=2, max_size=20))
def test_the_standard_error_with_equal_weights_is_the_textbook_one(values):
    values = np.array(values)
    expected = values.std(ddof=1) / math.sqrt(len(values))
    assert weighted_standard_error(values, np.ones(len(values))) == pytest.approx(
        expected, abs=1e-9)


# --- batches that fit the data (issue 41, item 3) -----------------------------------------

def test_a_batch_above_half_the_training_set_is_marked_and_never_chosen():
    """With 1500 samples, B = 1024 is one step an epoch that drops 476 samples: the plan
    says so, and objective "time", which would take the largest batch, does not."""
    plan = make_plan(objective="time", dataset_size=1500)
    big = plan.table[plan.table["global_batch"] == 1024]
    assert (big["steps_per_epoch"] == 1).all() and (big["samples_dropped"] == 476).all()
    assert not big["feasible"].any()
    assert big["infeasible_reason"].str.contains(
        "B above half the training set: 1 step.* 476 of 1500 samples dropped").all()
    assert plan.choice.global_batch <= 750


@pytest.mark.parametrize("objective", ["time_to_accuracy", "cost_to_accuracy",
                                       "knee_to_accuracy"])
def test_train_runs_the_choices_epochs_to_target_by_default(objective):
    """The plan's time to accuracy counts the choice's epochs to target; `train`'s default
    epochs are those, rounded up (issue 41, item 3), and the plan's `epochs` under the
    scale-invariant budget, which counts epochs at the reference batch as the plan does."""
    from tula_ray.runs.training_job import resolve_job

    plan = make_plan(objective=objective, noise_scale=300.0, workload="fashion-mnist-cnn",
                     meta={"workload_options": {"data": "fake", "fake_size": 10000}})
    to_target = float(plan.chosen["epochs_to_target"])
    assert plan.epochs_to_train == math.ceil(to_target) >= EPOCHS
    assert resolve_job(plan, "ags-ns", None, None, None, None).epochs == plan.epochs_to_train
    assert resolve_job(plan, "ags-ns", None, None, None, None,
                       budget="scale-invariant").epochs == EPOCHS
    assert resolve_job(plan, "ags-ns", None, None, 2, None).epochs == 2  # the user's, kept


def test_train_runs_the_plans_epochs_under_a_per_epoch_objective():
    plan = make_plan(objective="time")
    assert plan.epochs_to_train == EPOCHS  # what estimated_total_time_s counts
