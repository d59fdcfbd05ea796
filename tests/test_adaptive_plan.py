"""The plan predicts the adaptive run (issue 44, item 2): the noise scale's trajectory the
plan states, the adaptive rows integrated over it, and their place in the choice. Pure
logic: no Ray."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from paper_profiles import paper_profiles
from result_checks import summary_words

from tula_ray.models import perf
from tula_ray.models.goodput import SWITCH_GAIN_DEFAULT, goodput
from tula_ray.models.noise_scale import efficiency
from tula_ray.planning.adaptive_batch import (accumulated_step_s, adaptive_memory_bound,
                                              adaptive_step_times, fixed_run_time_s,
                                              integrate_adaptive_run,
                                              memory_bound, reference_samples)
from tula_ray.planning.context import PlanContext
from tula_ray.planning.noise_trajectory import NoiseTrajectory, constant_trajectory
from tula_ray.planning.plan import Plan, build_plan
from tula_ray.planning.policy import Choice
from tula_ray.planning.synthetic import example_params
from tula_ray.space import SearchSpace

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=1024)
EPOCHS, DATASET = 5, 10000


def rising_profiles(exponent=0.8, levels=True):
    """Full-search profiles whose phi = 20 (samples / 1000)^exponent rises with the samples
    trained before each row's noise (noise_after_samples; one level when not `levels`)."""
    profiles = paper_profiles(SPACE.candidates(), example_params(), seed=2)
    after = (profiles["global_batch"].rank(method="dense").to_numpy() * 2000.0 if levels
             else np.full(len(profiles), 2000.0))
    return profiles.assign(grad_sqr=1.0, grad_var=20 * (after / 1000) ** exponent,
                           noise_steps=4, noise_after_samples=after)


def constant_profiles():
    """Profiles as recorded before issue 43: phi measured, noise_after_samples NaN."""
    return paper_profiles(SPACE.candidates(), example_params(), seed=2).assign(
        grad_sqr=1.0, grad_var=100.0, noise_steps=4)


def make_plan(profiles, **options):
    context = dict(epochs=EPOCHS, dataset_size=DATASET, objective="time_to_accuracy")
    return build_plan(SPACE, profiles, PlanContext(**{**context, **options}),
                      search_strategy="full")


def fixed_time(plan, row, trajectory):
    """A fixed row of the plan kept throughout the trajectory: its seconds to the target."""
    batch = int(row["global_batch"])
    cost = ((row["estimated_total_time_s"] - row["startup_time_s"])
            / (plan.epochs * (plan.dataset_size // batch) * batch))
    total = reference_samples(plan.epochs, plan.dataset_size, 32)
    return integrate_adaptive_run({batch: cost}, trajectory, total, 32).time_s \
        + row["startup_time_s"]


def test_a_rising_noise_is_fitted_and_stated_in_the_plan():
    plan = make_plan(rising_profiles())
    stated = plan.meta["noise_trajectory"]
    assert stated["kind"] == "fitted" and "fitted to 12 profile rows" in stated["source"]
    phi = np.array(stated["noise_scale"])
    assert np.all(np.diff(phi) >= 0) and phi[-1] > 2 * phi[0]
    assert stated["progress_samples"][0] == 0
    assert stated["progress_samples"][-1] == reference_samples(EPOCHS, DATASET, 32)
    assert phi.max() <= DATASET  # never above the training set


def test_the_adaptive_row_switches_where_the_runs_controller_does():
    """The row's batches are the ones `train`'s controller takes when it reads the stated
    trajectory's phi at the row's slices: the plan predicts the run it would train."""
    from tula_ray.planning.adaptive_batch import ADAPTIVE_SLICES
    from tula_ray.runs.adaptive_batch import adaptive_batch_of

    plan = make_plan(rising_profiles())
    trajectory = NoiseTrajectory.from_dict(plan.meta["noise_trajectory"])
    total = reference_samples(EPOCHS, DATASET, 32)
    edges = np.linspace(0.0, total, ADAPTIVE_SLICES + 1)
    assert sorted(plan.adaptive["num_workers"]) == [1, 2]
    for _, row in plan.adaptive.iterrows():
        controller = adaptive_batch_of(plan, int(row["num_workers"]), int(row["global_batch"]))
        taken = [int(row["global_batch"])]
        for phi in trajectory.at((edges[:-1] + edges[1:]) / 2):
            batch = controller.decide(float(phi), step=0, samples=0).global_batch
            taken += [batch] if batch != taken[-1] else []
        assert row["batches"] == " > ".join(str(b) for b in taken)
        assert row["switches"] >= 1 and row["final_batch"] > row["global_batch"]
        fixed = plan.table[(plan.table["num_workers"] == row["num_workers"])
                           & plan.table["feasible"]]
        times = [fixed_time(plan, f, trajectory) for _, f in fixed.iterrows()]
        assert row["fixed_time_to_accuracy_s"] == pytest.approx(min(times))


def test_the_runs_batches_stay_within_the_users_max_batch_as_the_rows_do():
    """max_batch=256 on a space to 1024, with a memory bound of b = 64: the adaptive row
    and `train`'s controller both keep B <= 256, accumulating above b = 64 (before, the
    controller also took B = 512 and 1024, in accumulated micro-batches)."""
    from tula_ray.runs.adaptive_batch import adaptive_batch_of

    plan = make_plan(rising_profiles(), max_global_batch=256, max_local_batch=64)
    assert plan.meta["adaptive_batch"]["max_local_batch"] == 64
    for _, row in plan.adaptive.iterrows():
        assert max(int(b) for b in row["batches"].split(" > ")) <= 256
        controller = adaptive_batch_of(plan, int(row["num_workers"]), int(row["global_batch"]))
        assert max(option.global_batch for option in controller.options) == 256


@pytest.mark.parametrize("profiles", [constant_profiles(), rising_profiles(levels=False),
                                      rising_profiles(exponent=-0.5)],
                         ids=["no samples recorded", "one level", "falling"])
def test_with_no_trend_the_adaptive_row_keeps_the_batch_the_run_would(profiles):
    """A constant phi: the row stays at the batch with the run's most goodput, in that
    fixed row's time to accuracy; never faster than the best fixed row, so not chosen."""
    from tula_ray.runs.adaptive_batch import adaptive_batch_of

    plan = make_plan(profiles)
    stated = plan.meta["noise_trajectory"]
    assert stated["kind"] == "constant" and "no trend" in stated["source"]
    phi = plan.meta["noise"]["noise_scale"]
    assert set(stated["noise_scale"]) == {phi}
    for _, row in plan.adaptive.iterrows():
        n = int(row["num_workers"])
        goodputs = adaptive_batch_of(plan, n, int(row["global_batch"])).goodputs(phi)
        kept = plan.table.set_index(["num_workers", "global_batch"]).loc[
            (n, max(goodputs, key=goodputs.get))]
        assert row["switches"] == 0 and row["global_batch"] == kept.name[1]
        assert row["time_to_accuracy_s"] == pytest.approx(kept["time_to_accuracy_s"], rel=1e-9)
        assert row["epochs_to_target"] == pytest.approx(kept["epochs_to_target"], rel=1e-9)
        best = plan.table.loc[plan.table["num_workers"] == n, "time_to_accuracy_s"].min()
        assert row["time_to_accuracy_s"] >= best * (1 - 1e-9)
    assert not plan.choice.adaptive


def test_a_given_noise_scale_is_the_trajectorys_end():
    rising = make_plan(rising_profiles(), noise_scale=500.0).meta["noise_trajectory"]
    assert rising["kind"] == "given" and rising["noise_scale"][-1] == pytest.approx(500.0)
    flat = make_plan(constant_profiles(), noise_scale=500.0).meta["noise_trajectory"]
    assert flat["kind"] == "constant" and set(flat["noise_scale"]) == {500.0}


def test_the_integration_of_a_two_phase_run_by_hand():
    """phi 10 over the first half of the work, 1000 over the second: B = 32 wins the first
    (fewer wasted samples), B = 128 the second (faster per sample, E ~ 1)."""
    cost = {32: 1e-3, 128: 0.5e-3}  # seconds per trained sample
    total, m0 = 1.0e6, 32
    trajectory = NoiseTrajectory("given", (0.0, total / 2, total / 2 + 1e-6, total),
                                 (10.0, 10.0, 1000.0, 1000.0), "two phases")
    run = integrate_adaptive_run(cost, trajectory, total, m0, slices=10)
    first = (total / 2) / goodput(1 / cost[32], 10.0, 32, m0)  # E(32) = 1
    second = (total / 2) / goodput(1 / cost[128], 1000.0, 128, m0)
    assert goodput(1 / cost[128], 10.0, 128, m0) < goodput(1 / cost[32], 10.0, 32, m0)
    assert run.time_s == pytest.approx(first + second)
    assert run.schedule == ((0.0, 32), (total / 2, 128))
    assert run.samples_by_batch[128] == pytest.approx((total / 2) / efficiency(1000.0, 128, m0))
    assert run.epochs(DATASET) == pytest.approx(
        (total / 2) / (DATASET // 32 * 32)
        + run.samples_by_batch[128] / (DATASET // 128 * 128))


def test_the_run_ranks_the_batches_and_the_costs_count_the_time():
    """A ranking that prefers B = 128 where the costs per sample prefer 32: the run trains
    128 (as ranked) for the seconds the costs say."""
    cost, ranking = {32: 1e-3, 128: 1e-3}, {32: 1e-3, 128: 0.1e-3}
    total, phi = 1.0e6, 100.0
    flat = constant_trajectory(phi, total, "test")
    run = integrate_adaptive_run(cost, flat, total, 32, ranking=ranking)
    assert run.batches == (128,)
    assert run.time_s == pytest.approx(total / goodput(1 / cost[128], phi, 128, 32))
    assert integrate_adaptive_run(cost, flat, total, 32).batches == (32,)  # the costs' own


@settings(max_examples=40, deadline=None)
@given(costs=st.lists(st.floats(1e-4, 1e-2), min_size=2, max_size=5),
       start=st.floats(1.0, 1e3), growth=st.floats(1.0, 100.0))
def test_adapting_is_within_the_hysteresis_of_every_fixed_batch(costs, start, growth):
    batches = [32 * 2 ** i for i in range(len(costs))]
    cost = dict(zip(batches, costs))
    total = 1.0e6
    trajectory = NoiseTrajectory("fitted", (0.0, total), (start, start * growth), "test")
    run = integrate_adaptive_run(cost, trajectory, total, 32)
    fixed = [integrate_adaptive_run({b: c}, trajectory, total, 32).time_s
             for b, c in cost.items()]
    assert fixed == pytest.approx([fixed_run_time_s(c, b, trajectory, total, 32)
                                   for b, c in cost.items()])
    assert run.time_s <= min(fixed) * (1 + SWITCH_GAIN_DEFAULT) * (1 + 1e-12)
    flat = constant_trajectory(start, total, "test")
    steady = integrate_adaptive_run(cost, flat, total, 32)
    assert len(steady.schedule) == 1
    assert steady.time_s == pytest.approx(min(
        integrate_adaptive_run({b: c}, flat, total, 32).time_s for b, c in cost.items()))


def test_a_step_above_the_memory_bound_accumulates_micro_steps():
    params = example_params()
    step, micro = accumulated_step_s(params, 1, 256, 64)
    compute = float(perf.predict_compute_s(params, 1, 64))
    assert micro == 4
    assert step == pytest.approx(3 * compute + float(perf.predict_step_s(params, 1, 64)))
    times = adaptive_step_times(params, 2, [64, 512], max_local_batch=128)
    assert times[64] == (pytest.approx(float(perf.predict_step_s(params, 2, 32))), 1)
    assert times[512][1] == 2
    assert memory_bound(math.inf, None, None) is None
    assert memory_bound(256.0, 200, 150) == 150 and memory_bound(128.0, None, None) == 127


def test_above_the_memory_bound_the_adaptive_run_accumulates():
    """With a bound of 32 samples a worker and phi growing large, the run at N = 2 ends
    above it: two micro-steps share one all-reduce, which halves its cost per sample."""
    plan = make_plan(rising_profiles(exponent=1.5), max_local_batch=32)
    assert adaptive_memory_bound(plan.meta) == 32
    two = plan.adaptive.set_index("num_workers").loc[2]
    assert two["final_batch"] > 64 and two["accumulation_steps"] > 1
    assert not plan.table.loc[plan.table["local_batch"] > 32, "feasible"].any()


def test_the_to_accuracy_objectives_choose_the_fastest_adaptive_row():
    plan = make_plan(rising_profiles())
    best = plan.adaptive.loc[plan.adaptive["time_to_accuracy_s"].idxmin()]
    assert best["time_to_accuracy_s"] < plan.table["time_to_accuracy_s"].min()
    assert plan.choice.adaptive and plan.choice.num_workers == best["num_workers"]
    assert plan.choice.global_batch == best["global_batch"]
    assert "adaptive batch at N=" in plan.choice.reason
    assert plan.chosen["time_to_accuracy_s"] == best["time_to_accuracy_s"]
    assert plan.epochs_to_train == math.ceil(best["epochs_to_target"] - 1e-9)
    assert "adaptive batch from B=" in summary_words(plan)
    cheapest = make_plan(rising_profiles(), objective="cost_to_accuracy")
    assert cheapest.choice.adaptive


@pytest.mark.parametrize("options", [{"objective": "time"}, {"objective": "knee_to_accuracy"},
                                     {"objective": "knee"}, {"adaptive_batch": False}])
def test_other_objectives_and_the_option_off_keep_the_fixed_rows(options):
    plan = make_plan(rising_profiles(), **options)
    assert not plan.choice.adaptive and not plan.adaptive.empty


def test_the_adaptive_rows_and_the_trajectory_round_trip_and_print(tmp_path):
    plan = make_plan(rising_profiles())
    again = Plan.from_json(plan.to_json(tmp_path / "plan.json"))
    assert again.choice == plan.choice and again.choice.adaptive
    assert again.meta["noise_trajectory"] == plan.meta["noise_trajectory"]
    for column in plan.adaptive:
        assert list(again.adaptive[column]) == pytest.approx(list(plan.adaptive[column])) \
            if plan.adaptive[column].dtype.kind == "f" else \
            list(again.adaptive[column]) == list(plan.adaptive[column])
    text = summary_words(again)
    assert "adaptive batch to the target" in text and "noise scale trajectory" in text


def test_a_plan_written_before_the_adaptive_rows_still_loads():
    data = json.loads(make_plan(rising_profiles()).to_json())
    for key in ("noise_trajectory", "adaptive_batch"):
        data["meta"].pop(key)
    data.pop("adaptive")
    data["choice"] = Choice(1, 32, "time_to_accuracy", "old").to_dict()
    data["choice"].pop("adaptive")
    old = Plan.from_json(json.dumps(data))
    assert old.adaptive.empty and not old.choice.adaptive
    assert old.chosen["global_batch"] == 32
    assert "adaptive batch" not in summary_words(old)


def test_no_noise_scale_no_adaptive_rows():
    plan = make_plan(paper_profiles(SPACE.candidates(), example_params(), seed=2),
                     objective="time")
    assert plan.adaptive.empty and "noise_trajectory" not in plan.meta
