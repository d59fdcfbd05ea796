"""Training precision (issue 24, item 4), on CPU with a user's own Workload: bf16 and fp16
autocast in the step, the evaluation and the memory probe; fp16's loss scaling (AGS reading
unscaled gradients, overflowing steps skipped, the scale kept in checkpoints); the setting
carried from search and train to the workers, and from the plan to train."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tula_ray.precision import PRECISIONS, autocast_for, check_precision, set_math_mode
from tula_ray.training.measure import peak_memory_bytes
from tula_ray.training.run import fit
from tula_ray.workloads import Workload, in_precision, resolve_workload

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")


class SeesItsDtype(nn.Module):
    """A user's model that records what its layers computed in."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 4)
        self.seen: set[torch.dtype] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.conv(x))
        self.seen.add(hidden.dtype)
        return self.head(hidden.flatten(1))


def _data(size: int = 128) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(size, 1, 8, 8, generator=generator),
                         torch.randint(0, 4, (size,), generator=generator))


MODELS: list[SeesItsDtype] = []


def _model() -> SeesItsDtype:
    MODELS.append(SeesItsDtype())
    return MODELS[-1]


def _workload(precision: str = "fp32") -> Workload:
    return Workload("mine", model_fn=_model, train_dataset_fn=_data,
                    test_dataset_fn=lambda: _data(40), epochs=2, precision=precision)


@pytest.fixture(autouse=True)
def _restore_math_mode():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("strategy", ["lbt", "ags"])
def test_bf16_trains_in_bf16_and_fp32_in_fp32(strategy):
    for precision, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32),
                             ("fp16", torch.float16)):
        MODELS.clear()
        frame = fit(_workload(precision), global_batch=64, strategy=strategy)
        assert frame["train_loss"].notna().all() and frame["test_loss"].notna().all()
        assert MODELS[0].seen == {dtype}, precision  # the training and the evaluation
        assert all(p.dtype == torch.float32 for p in MODELS[0].parameters())  # weights stay


def test_the_memory_probe_steps_in_the_workloads_precision():
    shape = {"sample_shape": (1, 8, 8), "num_classes": 4}
    fp32 = peak_memory_bytes(_workload("fp32"), 256, device="cpu", **shape)
    bf16 = peak_memory_bytes(_workload("bf16"), 256, device="cpu", **shape)
    assert bf16 < fp32  # activations in half the bytes


def test_precisions_are_checked_by_name():
    assert check_precision("bf16") == "bf16" and "tf32" in PRECISIONS
    assert check_precision("fp16") == "fp16"
    with pytest.raises(ValueError, match=r"precision='fp64' is not allowed; use one of"):
        _workload("fp64")
    with pytest.raises(TypeError, match="precision=16"):
        check_precision(16)


def test_tf32_is_set_explicitly_and_autocast_only_for_a_reduced_precision():
    assert set_math_mode("fp32") == {"tf32_matmul": False, "tf32_cudnn": False}
    assert not torch.backends.cudnn.allow_tf32  # torch's own default is True
    assert set_math_mode("tf32") == {"tf32_matmul": True, "tf32_cudnn": True}
    assert autocast_for("fp32", "cpu") is contextlib.nullcontext
    with autocast_for("bf16", "cpu")():
        assert torch.is_autocast_enabled("cpu")


def test_precision_reaches_the_workers_as_an_option_or_a_field():
    spec, options, resolved = in_precision(
        "fashion-mnist-cnn-fake", {"fake_size": 64},
        resolve_workload("fashion-mnist-cnn-fake", {"fake_size": 64}), "bf16")
    assert (spec, options["precision"], resolved.precision) == (
        "fashion-mnist-cnn-fake", "bf16", "bf16")
    assert resolve_workload(spec, options).precision == "bf16"  # what a worker rebuilds
    mine = _workload()
    spec, options, resolved = in_precision(mine, {}, mine, "tf32")
    assert spec is resolved and resolved.precision == "tf32" and options == {}
    assert in_precision(mine, {}, mine, None)[2].precision == "fp32"  # the workload's own


def test_train_takes_the_plans_precision_unless_told_otherwise():
    from tula_ray import SearchSpace, build_plan
    from tula_ray.planning.synthetic import example_params, synthetic_profiles
    from tula_ray.runs.training_job import resolve_job

    space = SearchSpace((1,), (32, 64))
    plan = build_plan(space, synthetic_profiles(space.candidates(), example_params()),
                      epochs=1, dataset_size=256, search_strategy="full", objective="time",
                      workload="fashion-mnist-cnn",
                      meta={"workload_options": {"data": "fake", "fake_size": 256},
                            "precision": "bf16"})
    job = resolve_job(plan, "lbt", None, None, None, None)
    assert job.workload.precision == "bf16" and job.options["precision"] == "bf16"
    assert resolve_job(plan, "lbt", None, None, None, None, "fp32").workload.precision == "fp32"
    with pytest.raises(ValueError, match="precision='fp8' is not allowed"):
        resolve_job(plan, "lbt", None, None, None, None, "fp8")


def _bf16_plan():
    from tula_ray import SearchSpace, build_plan
    from tula_ray.planning.synthetic import example_params, synthetic_profiles

    space = SearchSpace((1,), (32, 64))
    return build_plan(space, synthetic_profiles(space.candidates(), example_params()),
                      epochs=1, dataset_size=256, search_strategy="full", objective="time",
                      workload="fashion-mnist-cnn",
                      meta={"workload_options": {"data": "fake", "fake_size": 256},
                            "precision": "bf16"})


def test_training_in_another_precision_than_the_plans_is_noted(caplog):
    """Issue 46: the plan's step times and memory bound are those of the precision it was
    profiled in; a run in another says so, in its warning and in TrainResult.notes."""
    from tula_ray.runs.training_job import resolve_job

    plan = _bf16_plan()
    with caplog.at_level("WARNING"):
        job = resolve_job(plan, "lbt", None, None, None, None, "fp32")
    expected = "precision='fp32', but the plan's times were profiled in 'bf16'"
    assert any(note.startswith(expected) for note in job.notes)
    assert expected in caplog.text
    for same in (None, "bf16"):  # the plan's own precision: nothing to note
        assert not any("profiled in" in note for note in
                       resolve_job(plan, "lbt", None, None, None, None, same).notes)


def test_bf16_on_a_gpu_without_it_is_refused_before_any_trial_starts(monkeypatch):
    """The workload's check on a worker (the Ray task `train` and `search` run before any
    trial) refuses bf16 where torch.cuda.is_bf16_supported() is False, saying so."""
    from trainables.memory_probe import _check_and_measure
    from tula_ray.precision import check_precision_on_device

    asked = []

    def no_bf16(including_emulation: bool = True) -> bool:  # a V100 or a T4
        asked.append(including_emulation)
        return False

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", no_bf16)
    with pytest.raises(ValueError, match=r"precision='bf16', but this GPU has no bfloat16 "
                                         r"support \(torch.cuda.is_bf16_supported\(\) is False"):
        _check_and_measure(_workload("bf16"), {}, [], use_gpu=True)
    assert asked == [False]  # the GPU's own bfloat16, not torch's emulation of it
    check_precision_on_device("fp16", "cuda")  # what the error suggests instead
    check_precision_on_device("bf16", "cpu")  # torch's CPU autocast has it
