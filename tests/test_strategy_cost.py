"""The profiling's strategy phase (`tula_ray.training.profile_phases.strategy_extra_s`) on
one process, without Ray: plain and strategy steps are timed in alternating blocks, on a
user's own workload."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from tula_ray import Workload
from tula_ray.training.batches import training_batches
from tula_ray.training.profile_phases import ProfiledTraining, StrategyRun, strategy_extra_s
from tula_ray.training.step_timing import ALTERNATING_BLOCKS, cycle
from tula_ray.training.strategy_base import StrategySetup


def _tiny_workload() -> Workload:
    data = TensorDataset(torch.randn(256, 1, 4, 4), torch.randint(0, 3, (256,)))
    return Workload(name="user-tiny", model_fn=lambda: nn.Sequential(nn.Flatten(),
                                                                     nn.Linear(16, 3)),
                    train_dataset_fn=lambda: data, sample_shape=(1, 4, 4), num_classes=3)


class _RecordingAgreement:
    """Runs each phase on this process and records its label, in order."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def run(self, label, fn, inside=None):
        self.labels.append(label)
        return fn()

    def before_wait(self, label):  # one process: no peer to agree with before the wait
        return lambda: None


def test_plain_and_strategy_steps_alternate_in_blocks():
    workload = _tiny_workload()
    dataset = workload.train_dataset_fn()
    model = workload.model_fn()
    cpu = torch.device("cpu")
    plain = StrategySetup("plain", workload.optimizer_fn(model.parameters()))
    plain.set_precision(workload.precision, cpu)
    agreement = _RecordingAgreement()
    training = ProfiledTraining(model, plain, workload.loss_fn(), cpu,
                                agreement,  # type: ignore[arg-type]
                                prepare_model=lambda model: model)
    run = StrategyRun("lrs", {}, global_batch=16, epochs=1, steps_per_epoch=16,
                      workload=workload)
    batches = cycle(training_batches(dataset, 16, cpu, seed=0))

    extra = strategy_extra_s(training, run, batches, min_steps=6, budget_s=0.0)

    timed = [label for label in agreement.labels
             if label in ("strategy: plain steps", "strategy: steps")]
    assert timed == ["strategy: plain steps", "strategy: steps"] * ALTERNATING_BLOCKS
    assert isinstance(extra, float) and extra == extra  # a number, not NaN
