import json
import math

import numpy as np
import pandas as pd
import pytest
from paper_profiles import paper_profiles as synthetic_profiles
from result_checks import summary_words

from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import Plan, build_plan
from tula_ray.planning.policy import TIE_BREAK_RULE
from tula_ray.planning.synthetic import example_params
from tula_ray.space import SearchSpace, corners
from tula_ray.verbosity import wrap

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=1024)
# Most plans here are built with build_plan's former keywords, which still work
# (tests/test_plan_context.py checks their warning and that they build the same plan).
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")


def make_plan(**kwargs):
    profiles = synthetic_profiles(corners(SPACE.candidates()), example_params(), seed=2)
    options = dict(epochs=5, dataset_size=10000, objective="knee")
    options.update(kwargs)
    strategy, meta = options.pop("strategy", "partial"), options.pop("meta", None)
    return build_plan(SPACE, profiles, PlanContext(**options), search_strategy=strategy, meta=meta)


def test_every_candidate_is_predicted_and_measured_ones_are_marked():
    plan = make_plan()
    table = plan.table
    assert len(table) == len(SPACE.candidates())
    assert table["step_time_s"].notna().all() and table["total_time_s"].notna().all()
    measured = table[table["source"] == "measured"]
    assert sorted(zip(measured["num_workers"], measured["global_batch"])) == [
        (1, 32), (1, 1024), (2, 32), (2, 1024)]
    assert measured["measured_step_time_s"].notna().all()
    assert table.loc[table["source"] == "predicted", "measured_step_time_s"].isna().all()


def test_constraints_make_rows_infeasible_not_missing():
    plan = make_plan(max_workers=1, max_global_batch=256, objective="time")
    table = plan.table
    assert len(table) == len(SPACE.candidates())
    assert not table.loc[table["num_workers"] == 2, "feasible"].any()
    assert not table.loc[table["global_batch"] > 256, "feasible"].any()
    assert plan.choice.num_workers == 1 and plan.choice.global_batch <= 256


def test_oom_profile_lowers_the_bound_for_every_cluster_size():
    profiles = synthetic_profiles(SPACE.candidates(), example_params(), seed=2)
    oom = (profiles["num_workers"] == 1) & (profiles["global_batch"] == 512)
    profiles.loc[oom, ["status", "step_time_s"]] = ["oom", np.nan]
    plan = build_plan(SPACE, profiles, epochs=5, dataset_size=10000, search_strategy="full",
                      objective="time")
    table = plan.table.set_index(["num_workers", "global_batch"])
    assert table.loc[(1, 512), "infeasible_reason"] == "out of memory when profiled"
    assert not table.loc[(1, 1024), "feasible"]  # b = 1024 > 512
    assert not table.loc[(2, 1024), "feasible"]  # b = 512
    assert table.loc[(2, 512), "feasible"]  # b = 256 is fine


def test_json_round_trip_loses_nothing(tmp_path):
    plan = make_plan(pricing="memory:0.15", meta={"note": "round trip"})
    path = tmp_path / "plan.json"
    plan.to_json(path)
    again = Plan.from_json(path)
    pd.testing.assert_frame_equal(again.table, plan.table)
    pd.testing.assert_frame_equal(again.profiles, plan.profiles)
    assert again.perf == plan.perf
    assert again.memory == plan.memory
    assert again.choice == plan.choice
    assert again.pricing == plan.pricing and again.meta == plan.meta
    assert Plan.from_json(plan.to_json()).to_dict() == plan.to_dict()


def test_a_tie_is_one_summary_line_naming_the_rule_and_survives_json():
    """Partial search's four corners leave a wide uncertainty: the fastest ties with others,
    and the summary names them and the rule in one line (wrapped to 100 columns)."""
    plan = make_plan(objective="time")
    choice = plan.choice
    assert choice.ties and choice.tie_break.startswith(TIE_BREAK_RULE)
    tied = {(choice.num_workers, choice.global_batch), *choice.ties}
    assert (choice.num_workers, choice.global_batch) == min(tied)
    lines = [line for line in plan.summary().splitlines() if line.startswith("tied within")]
    assert len(lines) == 1 and wrap(choice.describe_ties()) in plan.summary()
    assert Plan.from_json(plan.to_json()).choice == choice


@pytest.mark.parametrize("saved", [
    {"ties": [[2, 64]], "tie_break": "the lowest central estimate of the time score"},
    {},  # before ties were named at all
])
def test_a_plan_saved_before_the_tie_rule_still_loads(saved):
    data = make_plan(objective="time").to_dict()
    data["choice"] = {key: value for key, value in data["choice"].items()
                      if key not in ("ties", "tie_break")} | saved
    plan = Plan.from_json(json.dumps(data))
    assert plan.choice.ties == tuple(tuple(pair) for pair in saved.get("ties", ()))
    assert plan.choice.tie_break == saved.get("tie_break", "")
    assert ("broken by the lowest central estimate" in summary_words(plan)) == bool(saved)


def test_plot_writes_non_empty_pngs(tmp_path):
    paths = make_plan().plot(tmp_path / "figures")
    assert [p.name for p in paths] == ["time_vs_batch.png", "cost_vs_batch.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_memory_pricing_changes_costs_not_times():
    fixed, by_memory = make_plan(pricing="fixed"), make_plan(pricing="memory")
    np.testing.assert_allclose(fixed.table["total_time_s"], by_memory.table["total_time_s"])
    assert not np.allclose(fixed.table["cost_usd"], by_memory.table["cost_usd"])


def test_bad_plan_inputs():
    with pytest.raises(ValueError, match="epochs=0"):
        make_plan(epochs=0)
    with pytest.raises(ValueError, match="objective='slow' is not allowed"):
        make_plan(objective="slow")


@pytest.mark.parametrize("dataset_size", [3333, 10000, 60000])
def test_the_knee_does_not_depend_on_rounding_steps_per_epoch(dataset_size):
    # T = E ceil(D/B) t_step is a sawtooth in B on the dense grid; Kneedle took its first
    # ripple for the knee (resnet18 here: B~34 instead of ~139). On the smooth curve the
    # knee depends on the model only, not on D.
    profiles = synthetic_profiles(SPACE.candidates(), example_params(), noise=0.0)
    reference = build_plan(SPACE, profiles, epochs=5, dataset_size=10**9, search_strategy="full")
    plan = build_plan(SPACE, profiles, epochs=5, dataset_size=dataset_size, search_strategy="full")
    assert reference.choice.knee_global_batch > SPACE.batch_sizes[0]
    assert plan.choice.knee_global_batch == pytest.approx(reference.choice.knee_global_batch)


# --- ground truth written from the paper's equations here, not by calling tula_ray.models.perf ----

EPOCHS, DATASET = 5, 10000
FIXED_INTERCEPT_S = 0.004  # eq. 2b: compute = intercept + per-sample cost x b, per N
PER_SAMPLE_S = {1: 150e-6, 2: 260e-6}  # two workers share the cores: slower per sample
SYNC_PER_UNIT_S = 0.008  # eq. 2c, ring all-reduce: sync = beta x (1 - 1/N)
USD_PER_NODE_HOUR = 2.48  # paper §IV-C1
PEAK_STATIC_BYTES, PEAK_PER_SAMPLE_BYTES = 5e7, 3e5  # eq. 3, linear in b


def hand_step_s(n: int, b_global: int) -> float:
    local = b_global / n
    return FIXED_INTERCEPT_S + PER_SAMPLE_S[n] * local + SYNC_PER_UNIT_S * (1 - 1 / n)  # eq. 2a


def hand_total_s(n: int, b_global: int) -> float:
    return EPOCHS * math.floor(DATASET / b_global) * hand_step_s(n, b_global)  # eq. 4a


def hand_cost_usd(n: int, b_global: int) -> float:
    return hand_total_s(n, b_global) / 3600 * n * USD_PER_NODE_HOUR  # eq. 4b


def exact_profiles(candidates) -> pd.DataFrame:
    rows = []
    for c in candidates:
        step = hand_step_s(c.num_workers, c.global_batch)
        sync = SYNC_PER_UNIT_S * (1 - 1 / c.num_workers)
        rows.append({**c.as_dict(), "compute_time_s": step - sync, "sync_time_s": sync,
                     "step_time_s": step, "samples_per_s": c.global_batch / step,
                     "peak_mem_bytes": PEAK_STATIC_BYTES + PEAK_PER_SAMPLE_BYTES * c.local_batch,
                     "status": "ok"})
    return pd.DataFrame(rows)


def exact_plan(objective: str, **kwargs) -> Plan:
    return build_plan(SPACE, exact_profiles(SPACE.candidates()), epochs=EPOCHS,
                      dataset_size=DATASET, search_strategy="full", objective=objective,
                      pricing=f"fixed:{USD_PER_NODE_HOUR}", **kwargs)


def test_times_and_costs_are_the_papers_equations_on_exact_profiles():
    table = exact_plan("time").table
    for _, row in table.iterrows():
        n, b = int(row["num_workers"]), int(row["global_batch"])
        assert row["step_time_s"] == pytest.approx(hand_step_s(n, b), rel=1e-6)
        assert row["total_time_s"] == pytest.approx(hand_total_s(n, b), rel=1e-6)
        assert row["cost_usd"] == pytest.approx(hand_cost_usd(n, b), rel=1e-6)


@pytest.mark.parametrize("objective, by_hand", [("time", hand_total_s), ("cost", hand_cost_usd)])
def test_the_choice_is_the_hand_computed_best(objective, by_hand):
    choice = exact_plan(objective).choice
    best = min(SPACE.candidates(), key=lambda c: by_hand(c.num_workers, c.global_batch))
    assert (choice.num_workers, choice.global_batch) == (best.num_workers, best.global_batch)


def test_the_plans_knee_is_kneedles_on_log2_b_of_the_predicted_time():
    """The knee objective end to end (dense curve, bent through the measurements, Kneedle,
    snap). On one worker the exact profiles' dense curve (unrounded D / B) is
    T(B) = E D (t0 / B + c), t0 the fixed cost per step and c the cost per sample. By
    hand, Kneedle (x and y normalised to [0, 1], the point farthest below the chord: the
    minimum of x_n + y_n) over x = log2 B finds 2^-x = (2^-x0 - 2^-x1) / ((x1 - x0) ln 2),
    whatever t0 and c: B ~ 114.5 on [32, 1024]. Over B itself it would be
    sqrt(992 / (1/32 - 1/1024)) ~ 181."""
    from tula_ray.planning.estimates import DENSE_POINTS

    plan = exact_plan("knee", max_workers=1)
    low, high = SPACE.batch_sizes[0], SPACE.batch_sizes[-1]
    x0, x1 = math.log2(low), math.log2(high)
    expected = ((2.0**-x0 - 2.0**-x1) / ((x1 - x0) * math.log(2))) ** -1
    grid_step = (high / low) ** (1 / (DENSE_POINTS - 1))  # ratio between dense points
    assert expected / grid_step <= plan.choice.knee_global_batch <= expected * grid_step
    assert (plan.choice.num_workers, plan.choice.global_batch) == (1, 128)  # nearest in log2


def test_the_memory_bound_makes_larger_local_batches_infeasible():
    # By hand (hand_total_s): N=2, B=1024 is the fastest (50 steps of 0.141 s), but its
    # local batch 512 is above a bound of 300; the best within it is N=2, B=512.
    unbounded = exact_plan("time").choice
    assert unbounded.local_batch > 300  # the bound must change the choice
    plan = exact_plan("time", max_local_batch=300)
    table = plan.table
    above = table["local_batch"] > 300
    assert above.any() and not table.loc[above, "feasible"].any()
    assert (table.loc[above, "infeasible_reason"] == "local batch above the memory bound 300").all()
    assert table.loc[~above, "feasible"].all()
    best = min((c for c in SPACE.candidates() if c.local_batch <= 300),
               key=lambda c: hand_total_s(c.num_workers, c.global_batch))
    assert (plan.choice.num_workers, plan.choice.global_batch) == (best.num_workers,
                                                                  best.global_batch)



def test_above_the_models_own_limit_the_reason_names_it():
    """Issue 41, item 4: the probe's limit (meta["batch_limit"]) names the model's error
    where a candidate is at or above the batch its code refused; the memory bound below."""
    error = "workload 'mine': memory probe at local batch 512 raised AssertionError: no"
    plan = exact_plan("time", max_local_batch=256,
                      meta={"batch_limit": {"local_batch": 512, "error": error}})
    table = plan.table.set_index("local_batch")
    assert (table.loc[table.index >= 512, "infeasible_reason"]
            == f"above the model's own batch limit (b=512): {error}").all()
    assert not table.loc[table.index > 256, "feasible"].any()
    assert "above the model's own batch limit (b=512)" in plan.summary()
    assert Plan.from_json(plan.to_json()).meta["batch_limit"]["local_batch"] == 512

# --- the choice rests on what was measured (issue 11: a choice measured, not only predicted) ---

def test_a_measured_candidate_is_chosen_on_its_measurement_not_its_prediction():
    # Every candidate follows eq. 2 exactly except N=1, B=256, measured 3x faster than the
    # equations (a real machine's effect the model cannot fit): it is the fastest by its
    # measurement, and the fit over 12 exact rows still predicts it near eq. 2.
    profiles = exact_profiles(SPACE.candidates())
    odd = (profiles["num_workers"] == 1) & (profiles["global_batch"] == 256)
    profiles.loc[odd, "step_time_s"] /= 3.0
    plan = build_plan(SPACE, profiles, epochs=EPOCHS, dataset_size=DATASET, search_strategy="full",
                      objective="time", pricing=f"fixed:{USD_PER_NODE_HOUR}")
    row = plan.table.set_index(["num_workers", "global_batch"]).loc[(1, 256)]
    assert row["estimate"] == "measured"
    assert row["estimated_total_time_s"] == pytest.approx(row["measured_total_time_s"])
    assert row["estimated_total_time_s"] < 0.5 * row["total_time_s"]  # prediction kept apart
    assert (plan.choice.num_workers, plan.choice.global_batch) == (1, 256)
    assert plan.choice.reason.endswith("figures are measured")


def test_unmeasured_candidates_are_chosen_on_their_predictions():
    plan = make_plan(objective="time")
    table = plan.table
    predicted = table["estimate"] == "predicted"
    assert predicted.any()
    assert (table.loc[predicted, "estimated_total_time_s"]
            == table.loc[predicted, "total_time_s"]).all()
    assert (table.loc[~predicted, "source"] == "measured").all()
    chosen = plan.chosen
    assert plan.choice.reason.endswith(f"figures are {chosen['estimate']}")


def test_the_dense_curve_passes_through_the_measurements_and_keeps_the_models_shape():
    """The knee's curve (estimates.through_measurements): at a measured batch it is the
    measurement; between two measured batches the ratio measured / predicted is
    interpolated in log2 B; at an N with nothing measured it is the model's."""
    from tula_ray.models.pricing import FixedRate
    from tula_ray.planning.estimates import through_measurements

    dense = pd.DataFrame({"num_workers": [1, 1, 1, 2], "global_batch": [32.0, 64.0, 128.0, 64.0],
                          "total_time_s": [100.0, 100.0, 100.0, 80.0],
                          "peak_mem_bytes": [1.0, 1.0, 1.0, 1.0], "feasible": True})
    table = pd.DataFrame({"num_workers": [1, 1, 2], "global_batch": [32, 128, 32],
                          "total_time_s": [100.0, 100.0, 90.0],
                          "measured_total_time_s": [200.0, 50.0, np.nan],
                          "estimate": ["measured", "measured", "predicted"]})
    bent = through_measurements(dense, table, FixedRate(1.0))
    assert bent["total_time_s"].tolist() == pytest.approx([200.0, 100.0, 50.0, 80.0])
    # ratio 2 at B=32 and 1/2 at B=128: halfway in log2 B the log-ratio is 0
    assert bent["cost_usd"].tolist() == pytest.approx(
        [t / 3600 * n for t, n in zip([200.0, 100.0, 50.0, 80.0], [1, 1, 1, 2])])


def test_training_times_include_the_strategys_measured_cost_per_step():
    """Issue 14, item 7: strategy_extra_s, measured once per worker group, is added to
    every step of that N (eq. 4a with t_step + extra); an N where it was not measured
    takes the nearest measured N's; a negative difference (noise) adds nothing."""
    profiles = synthetic_profiles(corners(SPACE.candidates()), example_params(), seed=2)
    first = (profiles["num_workers"] == 2) & (profiles["global_batch"] == 32)
    profiles.loc[first, "strategy_extra_s"] = 0.004
    plain = build_plan(SPACE, profiles.drop(columns="strategy_extra_s"), epochs=5,
                       dataset_size=10000, search_strategy="partial", objective="time")
    plan = build_plan(SPACE, profiles, epochs=5, dataset_size=10000, search_strategy="partial",
                      objective="time", meta={"training_strategy": "ags"})
    steps = 5 * np.floor(10000 / plan.table["global_batch"])
    # N=1 takes the nearest measured N's
    assert plan.table["strategy_extra_s"].to_numpy() == pytest.approx(np.full(12, 0.004))
    assert plan.table["total_time_s"].to_numpy() == pytest.approx(
        plain.table["total_time_s"].to_numpy() + steps.to_numpy() * 0.004)
    measured = plan.table["source"] == "measured"
    assert plan.table.loc[measured, "measured_total_time_s"].to_numpy() == pytest.approx(
        (plan.table.loc[measured, "measured_step_time_s"] + 0.004).to_numpy()
        * steps[measured].to_numpy())
    assert ("include ags's measured cost per step (N=1: +4 ms, N=2: +4 ms)"
            in summary_words(plan))
    assert "plain optimizer steps" in summary_words(plain)

    profiles.loc[first, "strategy_extra_s"] = -0.004
    noisy = build_plan(SPACE, profiles, epochs=5, dataset_size=10000, search_strategy="partial",
                       objective="time")
    assert (noisy.table["strategy_extra_s"] == 0).all()


def test_no_strategy_cost_where_the_strategy_trains_plain_steps():
    """AGS-NS at a B no larger than its reference batch (32) trains plain SGD steps: the
    plan adds its measured cost per step everywhere else, on the candidates and on the
    dense curve, marks those rows `plain_steps`, and the summary says so."""
    from tula_ray.planning.estimates import step_extras
    from tula_ray.training.strategies import plain_steps

    profiles = synthetic_profiles(corners(SPACE.candidates()), example_params(), seed=2)
    first = (profiles["num_workers"] == 2) & (profiles["global_batch"] == 32)
    profiles.loc[first, "strategy_extra_s"] = 0.004
    pairs = [(c.num_workers, c.global_batch) for c in SPACE.candidates()]
    plain_pairs = plain_steps("ags-ns", {}, pairs)
    assert plain_pairs == {(1, 32), (2, 32)}
    plan = build_plan(SPACE, profiles, epochs=5, dataset_size=10000, search_strategy="partial",
                      objective="time", meta={"training_strategy": "ags-ns"},
                      plain_steps=plain_pairs)
    table = plan.table
    small = table["global_batch"] == 32
    assert (table.loc[small, "strategy_extra_s"] == 0).all() and table.loc[small,
                                                                          "plain_steps"].all()
    assert table.loc[~small, "strategy_extra_s"].to_numpy() == pytest.approx(0.004)
    assert not table.loc[~small, "plain_steps"].any()
    everywhere = build_plan(SPACE, profiles, epochs=5, dataset_size=10000,
                            search_strategy="partial", objective="time")
    steps = 5 * np.floor(10000 / 32)
    assert table.loc[small, "total_time_s"].to_numpy() == pytest.approx(
        everywhere.table.loc[small, "total_time_s"].to_numpy() - steps * 0.004)
    assert "except where it trains plain optimizer steps (B <= 32)" in summary_words(plan)
    # Between candidates (the dense curve): plain up to the largest plain B of that N.
    dense = pd.DataFrame({"num_workers": [2, 2, 2, 4], "global_batch": [20.0, 32.0, 45.0, 20.0]})
    assert step_extras(dense, lambda n: np.full(len(n), 0.004), plain_pairs) == \
        pytest.approx([0.0, 0.0, 0.004, 0.004])
    assert plain_steps("lbt", {}, pairs) == set()  # no trains_plain: its cost everywhere


def test_candidates_the_training_strategy_cannot_train_are_marked_and_never_chosen():
    """Issue 22, item 6: the plan asks the training strategy (`refusals`) and keeps what it
    refuses out of the choice, with a column, the reason and a summary line."""
    from tula_ray.training.strategies import refusals

    space = SearchSpace.build((1, 2), min_batch=32, max_batch=256)
    profiles = synthetic_profiles(space.candidates(), example_params())
    pairs = [(c.num_workers, c.global_batch) for c in space.candidates()]
    # AGS with a reference of 64 samples at N = 2: a worker's batch must hold more than 64.
    refused = refusals("ags", {"small_batch": 64}, pairs)
    assert set(refused) == {(2, 128)}  # B <= 64: plain steps; B = 256: 128 > 64 per worker
    assert "from 64 samples of each worker's local batch of 64" in refused[(2, 128)]
    assert refusals("ags-ns", {}, pairs) == {}  # the default trains every candidate
    plan = build_plan(space, profiles, epochs=2, dataset_size=60_000, objective="time",
                      untrainable={(n, b): "no" for n, b in pairs if b != 64},
                      meta={"training_strategy": "ags"})
    assert plan.choice.global_batch == 64
    table = plan.table.set_index(["num_workers", "global_batch"])
    assert not table.loc[(1, 128), "trainable"] and not table.loc[(1, 128), "feasible"]
    assert table.loc[(1, 128), "infeasible_reason"] == "the training strategy cannot train it: no"
    assert table.loc[(2, 64), "trainable"]
    assert "ags cannot train N=1 B=32" in summary_words(plan)


def test_an_epoch_is_its_steps_plus_the_measured_evaluation_and_checkpoint():
    """Issue 24: `epoch_time_s` is the epoch's whole steps (what train's `seconds`
    measures); the evaluation pass (measured at one N, split over the workers at another),
    the checkpoint write and the start-up are their own columns, in the training total."""
    profiles = exact_profiles(SPACE.candidates())
    at_n2 = (profiles["num_workers"] == 2) & (profiles["global_batch"] == 32)
    profiles.loc[at_n2, ["eval_time_s", "checkpoint_time_s"]] = [0.5, 0.2]
    profiles["launch_wall_s"] = np.where(profiles["num_workers"] == 1, 8.0, 9.0)
    profiles["data_load_s"] = 1.0
    plan = build_plan(SPACE, profiles, epochs=EPOCHS, dataset_size=DATASET, search_strategy="full",
                      objective="time")
    for _, row in plan.table.iterrows():
        n, b = int(row["num_workers"]), int(row["global_batch"])
        assert row["epoch_time_s"] == pytest.approx(
            math.floor(DATASET / b) * hand_step_s(n, b), rel=1e-6)
        assert row["eval_time_s"] == pytest.approx(0.5 * 2 / n)  # N=1 evaluates it all
        assert row["checkpoint_time_s"] == pytest.approx(0.2)
        assert row["startup_time_s"] == pytest.approx({1: 9.0, 2: 10.0}[n])
        assert row["total_time_s"] == pytest.approx(
            EPOCHS * (row["epoch_time_s"] + 0.5 * 2 / n + 0.2) + row["startup_time_s"])
        assert row["measured_total_time_s"] == pytest.approx(row["total_time_s"], rel=1e-6)
    assert ("an evaluation pass per epoch, a checkpoint write per epoch, the start-up"
            in summary_words(plan))

    bare = build_plan(SPACE, exact_profiles(SPACE.candidates()), epochs=EPOCHS,
                      dataset_size=DATASET, search_strategy="full", objective="time")
    assert (bare.table["eval_time_s"] == 0).all()
    assert "not measured, left out: an evaluation pass per epoch" in summary_words(bare)


def test_an_evaluation_at_the_local_batch_is_priced_by_the_compute_cost_per_sample():
    """`train` evaluates at the training's local batch (a workload without eval_batch): the
    pass measured at (N=2, b=16) is priced at each candidate's b by eq. 2b's compute cost
    per sample (the fit's: exact here), split over the workers at another N; a context
    without the flag (a plan of before) keeps the measured pass at every b."""
    from tula_ray.models import perf

    profiles = exact_profiles(SPACE.candidates())
    at_n2 = (profiles["num_workers"] == 2) & (profiles["global_batch"] == 32)
    profiles.loc[at_n2, "eval_time_s"] = 0.5
    context = {"epochs": EPOCHS, "dataset_size": DATASET, "objective": "time"}
    plan = build_plan(SPACE, profiles, PlanContext(**context, eval_at_local_batch=True),
                      search_strategy="full")
    per_sample = {(n, b): float(perf.predict_compute_s(plan.perf, n, b)) / b
                  for n, b in zip(plan.table["num_workers"], plan.table["local_batch"])}
    for _, row in plan.table.iterrows():
        n, b = int(row["num_workers"]), float(row["local_batch"])
        expected = 0.5 * (2 / n) * per_sample[n, b] / per_sample[2, 16.0]
        assert row["eval_time_s"] == pytest.approx(expected, rel=1e-6)
    assert plan.table["eval_time_s"].nunique() > 2  # it moves with b, not only with N
    assert "an evaluation pass per epoch (at each candidate's local batch" \
        in summary_words(plan)
    before = build_plan(SPACE, profiles, PlanContext(**context), search_strategy="full")
    assert set(before.table["eval_time_s"].round(9)) == {0.5, 1.0}


def test_an_evaluation_pass_by_batch_from_rows_at_other_batches_and_its_fallbacks():
    from tula_ray.planning.estimates import evaluation_by_batch

    rows = pd.DataFrame({"num_workers": [1, 2], "local_batch": [32.0, 16.0],
                         "eval_time_s": [1.0, 0.4]})
    per_sample = lambda n, b: 1.0 / np.asarray(b, dtype=float) ** 0.5  # noqa: E731
    at = evaluation_by_batch(rows, per_sample)
    # N=1: its pass in units of its b's cost (1.0 x sqrt(32)), priced at b = 64
    assert at(np.array([1.0]), np.array([64.0]))[0] == pytest.approx(32 ** 0.5 / 8)
    assert at(np.array([4.0]), np.array([16.0]))[0] == pytest.approx(0.4 * 2 / 4)  # N=2's
    unscaled = evaluation_by_batch(rows)
    assert unscaled(np.array([1.0]), np.array([64.0]))[0] == pytest.approx(1.0)
    broken = evaluation_by_batch(rows, lambda n, b: np.full(np.shape(b), np.nan))
    assert broken(np.array([1.0]), np.array([64.0]))[0] == pytest.approx(1.0)
    assert evaluation_by_batch(rows.assign(eval_time_s=np.nan), per_sample) is None


def test_passes_measured_at_two_batches_are_interpolated_between_them():
    """A sweep's smallest and largest b (N = 2: 0.5 s at b = 16, 2 s at b = 512): log
    seconds linear in log2 b between them, held beyond, split over the workers at another
    N; a workload that evaluates at a batch of its own keeps one figure (their median)."""
    from tula_ray.planning.estimates import evaluation_by_batch

    rows = pd.DataFrame({"num_workers": [2, 2], "local_batch": [16.0, 512.0],
                         "eval_time_s": [0.5, 2.0]})
    at = evaluation_by_batch(rows, lambda n, b: np.ones(np.shape(b)))  # the cost: unused
    between = 0.5 * 4 ** 0.4  # log2 64 is 2/5 of the way from log2 16 to log2 512
    assert at(np.array([2.0, 1.0]), np.array([64.0, 64.0])) == pytest.approx(
        [between, 2 * between])
    assert at(np.array([2.0, 2.0]), np.array([8.0, 1024.0])) == pytest.approx([0.5, 2.0])
    fixed = evaluation_by_batch(rows)
    assert fixed(np.array([2.0]), np.array([64.0]))[0] == pytest.approx(1.25)

    profiles = exact_profiles(SPACE.candidates())
    for batch, seconds in ((32, 0.5), (1024, 2.0)):
        profiles.loc[(profiles["num_workers"] == 2) & (profiles["global_batch"] == batch),
                     "eval_time_s"] = seconds
    plan = build_plan(SPACE, profiles, PlanContext(epochs=EPOCHS, dataset_size=DATASET,
                                                   objective="time", eval_at_local_batch=True),
                      search_strategy="full")
    row = plan.table[(plan.table["num_workers"] == 1) & (plan.table["global_batch"] == 64)]
    assert row["eval_time_s"].iloc[0] == pytest.approx(2 * between)
    assert "between the passes measured at its N's smallest and largest b" in \
        summary_words(plan)


def test_the_start_up_is_the_launchs_whole_time_beyond_its_candidates_where_recorded():
    """Issue 24: a launch's set-up and end are waited for too (`launch_fixed_s`); a
    profile without it (an older search) keeps its start and data load."""
    profiles = exact_profiles(SPACE.candidates())
    profiles["launch_wall_s"] = 8.0
    profiles["data_load_s"] = 1.0
    profiles["launch_fixed_s"] = np.where(profiles["num_workers"] == 2, 15.0, np.nan)
    plan = build_plan(SPACE, profiles, epochs=EPOCHS, dataset_size=DATASET, search_strategy="full",
                      objective="time")
    startup = plan.table.groupby("num_workers")["startup_time_s"].unique()
    assert list(startup[1]) == [pytest.approx(9.0)] and list(startup[2]) == [15.0]
    assert "the start-up (the worker group's launch, data load, set-up and end)" in \
        summary_words(plan)
    # The search's check of the workload on a worker: `train` runs it before its launch.
    checked = build_plan(SPACE, profiles, epochs=EPOCHS, dataset_size=DATASET,
                         search_strategy="full", objective="time", meta={"workload_check_s": 4.0})
    assert (checked.table["startup_time_s"] == plan.table["startup_time_s"] + 4.0).all()
    assert "the start-up (the workload's check on a worker, the worker group's" in \
        summary_words(checked)


# --- a bill in whole nodes (issue 45, item 4) -----------------------------------------

NODE_USD_PER_HOUR = 12.0  # a 4-GPU node's price


def four_gpu_node_plan(pricing, sizes=(1, 2, 3, 4, 8)):
    """A full search's plan on nodes of 4 workers (G = 4), at batches every N divides."""
    pairs = [(n, b) for n in sizes for b in (96, 192, 384, 768)]
    space = SearchSpace.of_pairs([n for n, _ in pairs], [b for _, b in pairs])
    profiles = synthetic_profiles(space.candidates(), example_params(), seed=2)
    context = PlanContext(epochs=5, dataset_size=10000, objective="cost", pricing=pricing,
                          workers_per_node=4)
    return build_plan(space, profiles, context, search_strategy="full")


def test_a_plan_on_4_gpu_nodes_prices_1_to_4_workers_as_one_node():
    """A node is billed whole: N = 1, 2, 3 and 4 cost one node-hour per hour, N = 8 two,
    in every cost column (the estimates, the costs to accuracy)."""
    from tula_ray.models.pricing import FixedRate

    table = four_gpu_node_plan(FixedRate(NODE_USD_PER_HOUR)).table
    nodes = np.where(table["num_workers"] <= 4, 1.0, 2.0)
    for cost, time in (("estimated_cost_usd", "estimated_total_time_s"),
                       ("cost_usd", "total_time_s"),
                       ("cost_to_accuracy_usd", "time_to_accuracy_s")):
        np.testing.assert_allclose(table[cost], table[time] / 3600 * NODE_USD_PER_HOUR * nodes,
                                   err_msg=cost)
    # Shared nodes: each worker pays its quarter of one.
    shared = four_gpu_node_plan(FixedRate(NODE_USD_PER_HOUR, shared_nodes=True)).table
    np.testing.assert_allclose(shared["estimated_cost_usd"],
                               shared["estimated_total_time_s"] / 3600 * NODE_USD_PER_HOUR
                               * shared["num_workers"] / 4)


def test_a_pricing_written_before_whole_nodes_still_prices_a_plan():
    """A user's cost_usd(time_s, num_workers, peak_mem_bytes), with no workers_per_node: the
    plan calls it as before (N nodes), warning once that G is coming, and it loads again."""
    class PerWorkerHour:
        def cost_usd(self, time_s, num_workers, peak_mem_bytes):
            return np.asarray(time_s, float) / 3600 * np.asarray(num_workers, float)

        def to_dict(self):
            return {"kind": "per-worker-hour-test"}

    with pytest.warns(FutureWarning, match=r"workers_per_node.*removed in tula-ray \d"
                      ) as caught:
        plan = four_gpu_node_plan(PerWorkerHour(), sizes=(1, 2, 4))
    assert sum(issubclass(w.category, FutureWarning) for w in caught) == 1
    table = plan.table
    np.testing.assert_allclose(table["estimated_cost_usd"],
                               table["estimated_total_time_s"] / 3600 * table["num_workers"])
    assert Plan.from_json(plan.to_json()).pricing == {"kind": "per-worker-hour-test"}


def test_a_plan_saved_before_shared_nodes_still_loads():
    data = make_plan().to_dict()
    data["pricing"].pop("shared_nodes")
    assert Plan.from_json(json.dumps(data)).pricing == {"kind": "fixed", "usd_per_node_hour": 2.48}
