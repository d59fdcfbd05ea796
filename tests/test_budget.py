"""The scale-invariant budget (issue 25, item 3): AGS-NS keeps AdaScale's progress (its
whole-model gain summed over the steps), `fit(..., budget="scale-invariant")` trains until
that progress reaches the epochs at the reference batch, a checkpoint keeps it, and a
strategy without a gain trains its epochs and says so. A user's own Workload, no Ray."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from tula_ray.ags.equations import scalar_gain
from tula_ray.training.budget import Budget, budget_for
from tula_ray.training.checkpoints import checkpoint_state, restore_state
from tula_ray.training.run import fit, prepare_run
from tula_ray.workloads import Workload

SAMPLES, BATCH, REFERENCE = 256, 64, 16  # 4 steps an epoch; B / M0 = 4
EPOCHS = 2  # E0 at the reference batch: 2 x 256 / 16 = 32 reference steps


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _workload(noise: float) -> Workload:
    """Labels from a linear rule, each flipped at random with probability `noise`: much
    noise makes the gradient mostly noise (a large gain), none mostly signal."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, 6, generator=generator)
    labels = (inputs[:, :3].argmax(dim=1))
    flip = torch.rand(SAMPLES, generator=generator) < noise
    labels[flip] = torch.randint(0, 3, (int(flip.sum()),), generator=generator)
    data = TensorDataset(inputs, labels)
    return Workload("mine-budget", model_fn=_model, train_dataset_fn=lambda: data,
                    test_dataset_fn=lambda: data, epochs=EPOCHS)


OPTIONS = {"small_batch": REFERENCE}


@given(small=st.floats(1e-6, 1e3), large=st.floats(1e-6, 1e3),
       large_batch=st.sampled_from([64, 256, 2048]), measured=st.sampled_from([8, 16, 32]))
def test_the_gain_stays_within_adascales_bounds(small, large, large_batch, measured):
    r = float(scalar_gain(torch.tensor(small), torch.tensor(large), large_batch=large_batch,
                          measured_batch=measured, reference_batch=16))
    assert 1.0 <= r <= large_batch / 16


def test_the_gain_is_the_batch_ratio_for_pure_noise_and_one_for_pure_signal():
    # |G|^2 = 0: E|g_b|^2 = tr(Sigma)/b, so |g_b|^2 / |g_B|^2 = B/b, and r = B / b_ref
    noise = scalar_gain(torch.tensor(1.0 / 16), torch.tensor(1.0 / 256), large_batch=256,
                        measured_batch=16, reference_batch=16)
    assert float(noise) == pytest.approx(16.0)
    signal = scalar_gain(torch.tensor(2.0), torch.tensor(2.0), large_batch=256,
                         measured_batch=16, reference_batch=16)
    assert float(signal) == pytest.approx(1.0)


def test_a_scale_invariant_run_stops_when_its_progress_reaches_the_reference_epochs():
    frame = fit(_workload(noise=0.5), global_batch=BATCH, strategy="ags-ns", options=OPTIONS,
                budget="scale-invariant")
    target = EPOCHS * SAMPLES / REFERENCE
    progress = frame["progress"].tolist()
    assert progress[-1] >= target and all(p < target for p in progress[:-1])
    assert all(b > a for a, b in zip(progress, progress[1:]))  # every step adds r >= 1
    # between E0 epochs (every gain B / M0) and E0 x B / M0 (every gain 1)
    assert EPOCHS <= len(frame) <= EPOCHS * BATCH // REFERENCE
    # each epoch's 4 steps add between 4 and 4 x B / M0 reference steps
    steps = SAMPLES // BATCH
    assert steps <= progress[0] <= steps * BATCH / REFERENCE


def test_noisier_gradients_make_more_progress_per_epoch():
    clean = fit(_workload(noise=0.0), global_batch=BATCH, strategy="ags-ns", options=OPTIONS,
                epochs=1)
    noisy = fit(_workload(noise=0.9), global_batch=BATCH, strategy="ags-ns", options=OPTIONS,
                epochs=1)
    assert noisy["progress"].iloc[0] > clean["progress"].iloc[0]


def test_an_epoch_budget_reports_progress_and_trains_its_epochs():
    frame = fit(_workload(noise=0.5), global_batch=BATCH, strategy="ags-ns", options=OPTIONS,
                epochs=3)
    assert len(frame) == 3 and frame["progress"].notna().all()


def test_a_strategy_without_a_gain_trains_its_epochs_and_says_so():
    frame = fit(_workload(noise=0.5), global_batch=BATCH, strategy="lbt",
                budget="scale-invariant")
    assert len(frame) == EPOCHS and frame["progress"].isna().all()
    assert any("no gain" in note for note in frame.attrs["notes"])


def test_a_checkpoint_keeps_the_progress_and_a_finished_run_trains_no_more():
    workload = _workload(noise=0.5)
    run = prepare_run(workload, global_batch=BATCH, strategy="ags-ns", options=OPTIONS,
                      budget="scale-invariant")
    epochs = [epoch for epoch, _ in run.train_epochs()]
    done = run.setup.progress()[0]
    state = checkpoint_state(run.model, run.setup, epoch=epochs[-1])

    again = prepare_run(workload, global_batch=BATCH, strategy="ags-ns", options=OPTIONS,
                        budget="scale-invariant")
    start = restore_state(state, again.model, again.setup)
    assert again.setup.progress()[0] == pytest.approx(done)
    assert list(again.train_epochs(start)) == []  # its progress had reached the target

    # a checkpoint from before the progress was kept resumes from no progress
    del state["optimizer"]["ags"]["progress"]
    older = prepare_run(workload, global_batch=BATCH, strategy="ags-ns", options=OPTIONS)
    restore_state(state, older.model, older.setup)
    assert older.setup.progress()[0] == 0.0


def test_budgets_are_checked_by_name():
    with pytest.raises(ValueError, match="budget='steps'"):
        budget_for("steps", 2, None, 100)
    with pytest.raises(ValueError, match="budget='steps'"):
        fit(_workload(noise=0.5), global_batch=BATCH, strategy="lbt", budget="steps")


def test_the_budget_bounds():
    budget = Budget("scale-invariant", epochs=3, reference_batch=32, dataset_size=6400)
    assert budget.target_progress == 600 and budget.max_epochs(256) == 24
    assert budget.reached(600.0) and not budget.reached(599.0) and not budget.reached(None)
    assert Budget("epochs", epochs=3).max_epochs(256) == 3
    assert not Budget("epochs", epochs=3).reached(math.inf)
