import pytest
from hypothesis import given, strategies as st

import math

from tula_ray.space import (Candidate, ProfileGrid, SearchSpace, check_batch_in_dataset,
                            corners, geometric, middle, powers_of_two)


def test_defaults_are_powers_of_two_and_geometric_batches():
    space = SearchSpace.build(max_workers=16, min_batch=32, max_batch=1024)
    assert space.cluster_sizes == (1, 2, 4, 8, 16)
    assert space.batch_sizes == (32, 64, 128, 256, 512, 1024)
    assert len(space.candidates()) == 30
    assert Candidate(4, 256).local_batch == 64


def test_extremes_are_the_corners():
    space = SearchSpace.build((2, 4, 8), batch_sizes=(32, 64, 128))
    assert corners(space.candidates()) == [Candidate(2, 32), Candidate(2, 128), Candidate(8, 32),
                                Candidate(8, 128)]


def test_the_middle_is_the_inner_batch_nearest_the_geometric_mean():
    at_two = [Candidate(2, b) for b in (32, 64, 128, 256, 512, 1024, 2048)]
    assert middle(at_two) == Candidate(2, 256)
    assert middle(at_two[:4]) == Candidate(2, 64)  # 64 and 128 tie around 90.5: the smaller
    assert middle(at_two[:2]) is None and middle([]) is None


@given(st.lists(st.integers(1, 1 << 16), min_size=3, max_size=12, unique=True))
def test_the_middle_lies_strictly_inside_and_nearest_the_centre(batches):
    chosen = middle(Candidate(1, b) for b in batches)
    low, high = min(batches), max(batches)
    assert chosen is not None and low < chosen.global_batch < high
    centre = (math.log(low) + math.log(high)) / 2
    distance = abs(math.log(chosen.global_batch) - centre)
    assert all(distance <= abs(math.log(b) - centre) for b in batches if low < b < high)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(cluster_sizes=(), batch_sizes=(32,)), ValueError, "cluster_sizes is empty"),
    (dict(cluster_sizes=(0, 2), batch_sizes=(32,)), ValueError,
     r"cluster_sizes\[0\]=0; it must be an integer >= 1"),
    (dict(cluster_sizes=(2,), batch_sizes=(-32,)), ValueError, r"batch_sizes\[0\]=-32"),
    (dict(cluster_sizes=(2, 4.0), batch_sizes=(32,)), TypeError,
     r"cluster_sizes\[1\]=4.0; it must be an integer"),
    (dict(cluster_sizes=(3,), batch_sizes=(32,)), ValueError,
     "32 is not divisible by cluster size 3"),
])
def test_bad_spaces_name_the_value(kwargs, error, message):
    with pytest.raises(error, match=message):
        SearchSpace(**kwargs)


def test_min_above_max_is_refused():
    with pytest.raises(ValueError, match="min_batch=64 is larger than max_batch=32"):
        SearchSpace.build((1,), min_batch=64, max_batch=32)
    with pytest.raises(ValueError, match="min_workers=4 is larger than max_workers=2"):
        SearchSpace.build(min_workers=4, max_workers=2, max_batch=64)


def test_bound_keeps_batches_some_cluster_can_run():
    space = SearchSpace.build((1, 2), min_batch=32, max_batch=1024)
    assert space.bounded(max_local_batch=200).batch_sizes == (32, 64, 128, 256)
    with pytest.raises(ValueError, match="no batch size fits"):
        space.bounded(max_local_batch=8)


@given(st.integers(1, 64), st.integers(1, 5000), st.integers(2, 4))
def test_geometric_ladder(low, span, growth):
    values = geometric(low, low + span, growth)
    assert values[0] == low and values[-1] <= low + span < values[-1] * growth
    assert all(b == a * growth for a, b in zip(values, values[1:]))


@given(st.integers(1, 40), st.integers(0, 40))
def test_powers_of_two_include_bounds(low, span):
    values = powers_of_two(low, low + span)
    assert values[0] == low and values[-1] == low + span


def test_a_trial_configs_batches_are_read_once_into_a_profile_grid():
    """The JSON a trial config carries (what the searcher suggests and Tune stores)."""
    grid = ProfileGrid.of_config({"num_workers": 2, "global_batches": [256, 64], "round": 1})
    assert grid == ProfileGrid(2, (64, 256)) and grid.first_batch == 64
    assert ProfileGrid.of_config({"num_workers": "4", "global_batch": 128}) == ProfileGrid(
        4, (128,))


def test_a_batch_larger_than_the_dataset_is_named_with_it():
    check_batch_in_dataset("global_batch", 512, "mine", 512)  # one step per epoch: fine
    check_batch_in_dataset("global_batch", 4096, "mine", None)  # size not known yet
    with pytest.raises(ValueError, match=r"^min_batch=64 is larger than the dataset of mine "
                                         r"\(32 samples\); more data$"):
        check_batch_in_dataset("min_batch", 64, "mine", 32, hint="; more data")
