"""Training to an accuracy (issue 43, item 1), without Ray: a user's own workload trained
by `fit(target_accuracy=)` stops at the first evaluation of the validation split that
reaches the target, reports when, and reads the test set once, at the end. The Ray path
(`tula_ray.train(target_accuracy=)`) is tested in test_cli_ray.py."""

import math

import pytest
from torch.utils.data import Dataset

from tests.text_workload import TEXT_WORKLOAD, Tokens
from tula_ray.training.data import split_validation
from tula_ray.training.run import fit
from tula_ray.evaluation_schedule import evaluation_interval
from tula_ray.training.target import Target, TargetTracker

BATCH = 16


class Counted(Dataset):
    """A dataset that counts the samples read from it."""

    def __init__(self, inner: Dataset) -> None:
        self.inner, self.reads = inner, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        self.reads += 1
        return self.inner[index]


def _workload(test: Counted, **fields):
    from dataclasses import replace

    return replace(TEXT_WORKLOAD, test_dataset_fn=lambda: test, **fields)


def test_a_reachable_target_stops_the_run_there_and_reads_the_test_set_once():
    test = Counted(Tokens(256, seed=1))
    frame = fit(_workload(test), global_batch=BATCH, epochs=30, target_accuracy=0.6,
                eval_every_samples=64, validation_fraction=0.25)
    target, evaluations = frame.attrs["target"], frame.attrs["evaluations"]
    assert target["target_reached"] and len(frame) < 30  # it stopped before its epochs
    reached = evaluations[evaluations["val_accuracy"] >= 0.6]
    assert len(reached) == 1 and reached.index[0] == len(evaluations) - 1  # the first, last
    assert target["steps_to_target"] == reached["steps"].iloc[0]
    assert target["samples_to_target"] == target["steps_to_target"] * BATCH
    assert (evaluations["steps"].diff().dropna() == 4).all()  # every 64 samples of 16
    assert target["time_to_target_s"] > 0 and evaluations["seconds"].is_monotonic_increasing
    assert test.reads == len(test)  # the test set: once, whole, at the end
    assert frame["test_accuracy"].iloc[:-1].isna().all()
    assert not math.isnan(frame["test_accuracy"].iloc[-1])
    assert frame["val_accuracy"].iloc[-1] == reached["val_accuracy"].iloc[0]


def test_a_target_never_reached_ends_with_the_epochs_and_says_so():
    test = Counted(Tokens(256, seed=1))
    frame = fit(_workload(test), global_batch=BATCH, epochs=2, target_accuracy=1.0,
                validation_fraction=0.25)
    target = frame.attrs["target"]
    assert len(frame) == 2 and not target["target_reached"]
    assert math.isnan(target["time_to_target_s"]) and test.reads == len(test)
    # The default interval: about a quarter epoch of 192 training samples (12 steps).
    assert target["evaluations"] == 2 * 4


def test_the_workloads_own_validation_split_is_used_whole_and_the_training_set_whole():
    validation = Counted(Tokens(64, seed=2))
    test = Counted(Tokens(256, seed=1))
    frame = fit(_workload(test, val_dataset_fn=lambda: validation), global_batch=BATCH,
                epochs=1, target_accuracy=1.0)
    assert validation.reads == 4 * len(validation)  # 4 evaluations of the whole split
    # No sample held out of training: an epoch is 256 / 16 steps, the last evaluated.
    assert frame.attrs["evaluations"]["samples"].iloc[-1] == 256


def test_the_held_out_split_is_disjoint_from_training_and_never_the_test_set():
    train, validation = split_validation(Tokens(256), 0.25)
    assert set(train.indices).isdisjoint(validation.indices)
    assert len(validation) == 64


@pytest.mark.parametrize("arguments, message", [
    ({"target_accuracy": 0.0}, "target_accuracy=0.0"),
    ({"target_accuracy": 1.5}, "target_accuracy=1.5"),
    ({"eval_every_samples": 64}, "eval_every_samples=64 is only used with a target_accuracy"),
    ({"target_accuracy": 0.5, "eval_every_samples": 0}, "eval_every_samples=0"),
])
def test_bad_target_arguments_are_refused_naming_the_value(arguments, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        fit(TEXT_WORKLOAD, global_batch=BATCH, epochs=1, **arguments)


def test_the_interval_is_whole_steps_of_the_global_batch():
    assert evaluation_interval(None, 32, 100) == 25
    assert evaluation_interval(None, 32, 3) == 1
    assert evaluation_interval(100, 32, 100) == 3
    assert evaluation_interval(1, 32, 100) == 1


def test_the_trackers_state_carries_its_counts_and_history_over_a_resume():
    scores = iter([0.2, 0.4, 0.9])
    tracker = TargetTracker(Target(0.8, every_steps=2), 8,
                            lambda: {"val_loss": 1.0, "val_accuracy": next(scores)})
    tracker.start()
    assert [tracker.after_step(0) for _ in range(4)] == [False] * 4
    state = tracker.state_dict()
    resumed = TargetTracker(Target(0.8, every_steps=2), 8, tracker.evaluate)
    resumed.load_state_dict(state)
    resumed.start()
    assert [resumed.after_step(1) for _ in range(2)] == [False, True]
    summary = resumed.summary()
    assert summary["steps_to_target"] == 6 and summary["samples_to_target"] == 48
    assert summary["evaluations"] == 3 and summary["time_to_target_s"] >= state["seconds"]
