import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tula_ray.planning.policy import TIE_BREAK_RULE, choose, envelope, find_knee


def table(rows):
    frame = pd.DataFrame(rows, columns=["num_workers", "global_batch", "total_time_s", "cost_usd"])
    frame["feasible"] = True
    frame["infeasible_reason"] = ""
    return frame


HAND = table([
    (1, 32, 100.0, 10.0),
    (1, 64, 80.0, 8.0),
    (2, 64, 50.0, 9.0),
    (2, 128, 40.0, 12.0),
    (4, 128, 30.0, 20.0),
])


def test_min_time_and_min_cost():
    assert (choose(HAND, "time").num_workers, choose(HAND, "time").global_batch) == (4, 128)
    assert (choose(HAND, "cost").num_workers, choose(HAND, "cost").global_batch) == (1, 64)


def test_weighted_balances_and_reaches_the_extremes():
    only_time = choose(HAND, "weighted", weight_time=1.0)
    only_cost = choose(HAND, "weighted", weight_time=0.0)
    assert (only_time.num_workers, only_time.global_batch) == (4, 128)
    assert (only_cost.num_workers, only_cost.global_batch) == (1, 64)
    # 0.5 * T/30 + 0.5 * C/8: (2, 64) scores 1.396, the lowest.
    balanced = choose(HAND, "weighted", weight_time=0.5)
    assert (balanced.num_workers, balanced.global_batch) == (2, 64)


def test_infeasible_rows_are_never_chosen():
    constrained = HAND.copy()
    constrained.loc[constrained["num_workers"] == 4, ["feasible", "infeasible_reason"]] = [
        False, "more than max_workers=2"]
    choice = choose(constrained, "time")
    assert (choice.num_workers, choice.global_batch) == (2, 128)


LOW_B, HIGH_B, DENSE_POINTS = 32, 8192, 200


def dense_curve():
    batches = np.geomspace(LOW_B, HIGH_B, DENSE_POINTS)
    time = 1000.0 / batches + 2.0  # convex, decreasing, flattening: a clear knee
    return pd.DataFrame({"num_workers": 1, "global_batch": batches, "total_time_s": time,
                         "cost_usd": time, "feasible": True})


def kneedle_knee_by_hand() -> float:
    """Kneedle's knee of y = 1000 / B + 2 over x = log2(B), solved analytically.

    Kneedle (Satopaa et al., paper [32]) normalises x and y to [0, 1] and, for a
    convex decreasing curve, takes the point farthest below the chord from (0, 1) to
    (1, 0): the minimum of x_n + y_n. With x_n = (x - x0) / (x1 - x0) and
    y_n = (1000 * 2^-x - 1000 * 2^-x1) / (1000 * (2^-x0 - 2^-x1)), setting the derivative
    to 0 gives 2^-x = (2^-x0 - 2^-x1) / ((x1 - x0) * ln 2).
    """
    x0, x1 = np.log2(LOW_B), np.log2(HIGH_B)
    return float(((2.0**-x0 - 2.0**-x1) / ((x1 - x0) * np.log(2))) ** -1)  # B = 2^x


def test_knee_is_kneedles_on_the_dense_curve():
    dense = dense_curve()
    expected = kneedle_knee_by_hand()  # ~178
    grid_step = (HIGH_B / LOW_B) ** (1 / (DENSE_POINTS - 1))  # ratio between dense points
    knee = find_knee(dense["global_batch"], dense["total_time_s"])
    assert expected / grid_step <= knee <= expected * grid_step
    candidates = table([(1, b, 1000.0 / b + 2.0, 1.0) for b in (32, 64, 128, 256, 512, 1024,
                                                              2048, 4096, 8192)])
    choice = choose(candidates, "knee", dense=dense)
    assert choice.knee_global_batch == pytest.approx(knee)
    # The choice is the candidate nearest the knee in log2(B): 178 is nearer 128 than 256.
    assert choice.global_batch == 128
    assert "Kneedle" in choice.reason


def test_knee_fallback_is_reported():
    rising = table([(1, b, float(b), 1.0) for b in (32, 64, 128, 256)])  # no knee at all
    choice = choose(rising, "knee")
    assert choice.knee_global_batch is None
    assert "no knee found" in choice.reason
    assert choice.global_batch == 32


def test_envelope_takes_the_best_cluster_size_per_batch():
    best = envelope(HAND, "total_time_s")
    assert best[["num_workers", "global_batch"]].values.tolist() == [[1, 32], [2, 64], [4, 128]]


def test_bad_objective_and_empty_feasible_set():
    with pytest.raises(ValueError, match="objective='fastest' is not allowed"):
        choose(HAND, "fastest")
    with pytest.raises(ValueError, match="weight_time=1.5"):
        choose(HAND, "weighted", weight_time=1.5)
    nothing = HAND.assign(feasible=False, infeasible_reason="out of memory when profiled")
    with pytest.raises(ValueError, match="no feasible candidate among 5.*out of memory"):
        choose(nothing, "time")


def test_ties_within_the_uncertainty_are_named_and_how_they_were_broken():
    """Fastest: 100 s +- 10 % ties 105 s +- 10 % (intervals overlap: 90..110 and 94.5..115.5)
    but not 130 s +- 10 % (117..143 starts above 110)."""
    rows = table([(1, 32, 100.0, 1.0), (2, 64, 105.0, 2.0), (4, 128, 130.0, 4.0)])
    rows["rel_uncertainty"] = 0.10
    choice = choose(rows, "time", uncertainty="rel_uncertainty")
    assert (choice.num_workers, choice.global_batch) == (1, 32)
    # The rule breaks the tie; here it agrees with the central estimate.
    assert choice.ties == ((2, 64),) and TIE_BREAK_RULE in choice.tie_break
    assert "central estimate agrees" in choice.tie_break
    assert "N=2 B=64" in choice.describe_ties()
    rows["rel_uncertainty"] = 0.01  # 99..101 and 103.95..106.05 no longer overlap
    assert choose(rows, "time", uncertainty="rel_uncertainty").ties == ()


def test_knee_ties_survive_an_uncertainty_above_the_curve_itself():
    """A measured spread of 70 % (tiny steps on a loaded machine) must not tilt the curve
    below zero: the choice stands and any ties are candidates of the table."""
    rows = table([(1, b, 1000.0 / b ** 0.5 + 10, 1.0) for b in (32, 64, 128, 256, 512, 1024)])
    dense = rows.assign(feasible=True)
    choice = choose(rows, "knee", dense=dense, uncertainty="total_time_s",
                    dense_uncertainty=1.7)
    assert set(choice.ties) <= set(zip(rows["num_workers"], rows["global_batch"]))


def test_the_knee_is_the_most_pronounced_of_kneedles_knees():
    """A dense curve through a few measured points (linear between them in log2 B, as the
    plan's curve bent through measurements is) has a small knee at every point where it
    bends; the knee is the most pronounced one. By hand, normalising x = log2 B and y to
    [0, 1], the points (32, 696), (64, 614), (128, 541), (256, 400), (512, 308),
    (1024, 304) lie below the chord y = 1 - x by 0.01, -0.01 (above it), 0.16, 0.19 (at
    B = 512) and 0:
    Kneedle's difference curve peaks at B = 512; the first small knee is at B = 64."""
    points_b = np.array([32, 64, 128, 256, 512, 1024], dtype=float)
    points_t = np.array([696, 614, 541, 400, 308, 304], dtype=float)
    dense_b = np.geomspace(32, 1024, 256)
    dense_t = np.interp(np.log2(dense_b), np.log2(points_b), points_t)
    assert find_knee(dense_b, dense_t) == pytest.approx(512, rel=0.02)


def tied_table(rows, uncertainty):
    """`table` with the to-accuracy columns too, equal to the fixed-epoch ones (so every
    objective ranks the rows alike), and one relative uncertainty for every row."""
    frame = table(rows)
    frame["time_to_accuracy_s"] = frame["total_time_s"]
    frame["cost_to_accuracy_usd"] = frame["cost_usd"]
    frame["rel_uncertainty"] = uncertainty
    return frame


@pytest.mark.parametrize("objective", ["time", "cost", "weighted", "time_to_accuracy",
                                       "cost_to_accuracy"])
def test_a_tie_goes_to_the_fewest_workers_not_to_the_central_estimate(objective):
    """By hand, at +-10 %: (2, 64) scores 100 (90..110), (1, 128) 105 (94.5..115.5): they
    tie; (4, 256) scores 200 (180..220): no tie. The central estimate favours N=2; the
    rule takes N=1 (weighted: 0.5 T/100 + 0.5 C/100 gives 1.0, 1.05, 2.0, the same tie)."""
    rows = tied_table([(2, 64, 100.0, 100.0), (1, 128, 105.0, 105.0),
                       (4, 256, 200.0, 200.0)], 0.10)
    choice = choose(rows, objective, uncertainty="rel_uncertainty")
    assert (choice.num_workers, choice.global_batch) == (1, 128)
    assert choice.ties == ((2, 64),)  # the central estimate's pick, now a tie
    assert choice.tie_break.startswith(TIE_BREAK_RULE)
    assert "among the 2 tied candidates" in choice.tie_break
    assert "central estimate alone would choose N=2, B=64" in choice.tie_break
    assert choice.reason.endswith("within the uncertainty")
    line = choice.describe_ties()
    assert line.startswith("tied within the uncertainty with N=2 B=64; broken by fewest")
    assert "\n" not in line


def test_among_equal_cluster_sizes_a_tie_goes_to_the_smallest_batch():
    rows = tied_table([(1, 128, 100.0, 1.0), (1, 64, 104.0, 1.0), (1, 32, 300.0, 1.0)], 0.05)
    choice = choose(rows, "time", uncertainty="rel_uncertainty")
    assert (choice.num_workers, choice.global_batch) == (1, 64)
    assert choice.ties == ((1, 128),)


def test_without_a_tie_the_central_estimate_chooses_as_before():
    """At +-1 % (99..101 against 103.95..106.05) nothing ties: the lowest time, N=2."""
    rows = tied_table([(2, 64, 100.0, 100.0), (1, 128, 105.0, 105.0),
                       (4, 256, 200.0, 200.0)], 0.01)
    choice = choose(rows, "time", uncertainty="rel_uncertainty")
    assert (choice.num_workers, choice.global_batch) == (2, 64)
    assert choice.ties == () and choice.tie_break == "" and choice.describe_ties() == ""
    assert choice.reason == "lowest training time"
    assert choice == choose(rows, "time")  # as without any uncertainty at all


PAIRS = st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([32, 64, 128, 256, 512]))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), objective=st.sampled_from(["time", "cost", "weighted",
                                                  "time_to_accuracy", "cost_to_accuracy"]))
def test_the_choice_depends_only_on_the_tied_set(data, objective):
    """Perturb each row's time (and with it its cost) anywhere within its stated
    uncertainty: wherever the choice and its ties are the same set as before, the choice
    is the same candidate, the set's fewest workers then smallest batch, whichever of
    them the perturbed central estimate favours."""
    pairs = data.draw(st.lists(PAIRS, min_size=2, max_size=8, unique=True), label="pairs")
    count = len(pairs)
    times = data.draw(st.lists(st.floats(50.0, 200.0), min_size=count, max_size=count))
    spread = data.draw(st.lists(st.floats(0.0, 0.3), min_size=count, max_size=count))
    shift = data.draw(st.lists(st.floats(-1.0, 1.0), min_size=count, max_size=count))
    rows = tied_table([(n, b, t, t * n) for (n, b), t in zip(pairs, times)], spread)
    moved = rows.copy()
    factor = 1.0 + np.asarray(shift) * np.asarray(spread)
    for column in ("total_time_s", "cost_usd", "time_to_accuracy_s", "cost_to_accuracy_usd"):
        moved[column] = rows[column] * factor
    before = choose(rows, objective, uncertainty="rel_uncertainty")
    after = choose(moved, objective, uncertainty="rel_uncertainty")
    tied_before = {(before.num_workers, before.global_batch), *before.ties}
    tied_after = {(after.num_workers, after.global_batch), *after.ties}
    for choice, tied in ((before, tied_before), (after, tied_after)):
        assert (choice.num_workers, choice.global_batch) == min(tied)
    assume(tied_before == tied_after)
    assert (after.num_workers, after.global_batch) == (before.num_workers, before.global_batch)


def test_a_knee_tie_goes_to_the_smallest_batch_the_knee_lands_on():
    """The knee of 1000 / B + 2 is at B ~ 180, just past the midpoint of 128 and 250 in
    log2 (B ~ 179): the central knee snaps to 250; tilting the curve by +-5 % moves the
    knee below 179, onto 128. Both tie; the rule takes the smaller batch."""
    rows = tied_table([(1, b, 1000.0 / b + 2.0, 1.0) for b in (32, 64, 128, 250, 512, 1024)],
                      0.0)
    central = choose(rows, "knee", dense=dense_curve())
    choice = choose(rows, "knee", dense=dense_curve(), uncertainty="rel_uncertainty",
                    dense_uncertainty=0.05)
    assert central.global_batch == 250
    assert (choice.num_workers, choice.global_batch) == (1, 128)
    assert choice.ties == ((1, 250),)
    assert choice.knee_global_batch == central.knee_global_batch  # the central knee
    assert "Kneedle" in choice.reason and choice.reason.endswith("within the uncertainty")
    assert "central estimate alone would choose N=1, B=250" in choice.tie_break


@pytest.mark.parametrize("objective", ["knee", "knee_to_accuracy"])
def test_at_the_knees_batch_a_tie_goes_to_the_fewest_workers(objective):
    """The knee is at B ~ 180, nearest 128, where N=2 (9.6 s) is faster than N=1 (9.8 s)
    but ties it at +-5 % (9.12..10.08 and 9.31..10.29): the knee fixes B, the rule N."""
    rows = tied_table([(1, b, 1000.0 / b + 2.0, 1.0) for b in (32, 64, 128, 256, 512, 1024)]
                      + [(2, 128, 9.6, 2.0)], 0.05)
    dense = dense_curve().assign(time_to_accuracy_s=lambda d: d["total_time_s"])
    assert choose(rows, objective, dense=dense).num_workers == 2  # the central estimate
    choice = choose(rows, objective, dense=dense, uncertainty="rel_uncertainty")
    assert (choice.num_workers, choice.global_batch) == (1, 128)
    assert choice.ties == ((2, 128),)
    assert TIE_BREAK_RULE in choice.tie_break
