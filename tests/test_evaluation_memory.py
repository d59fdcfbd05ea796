"""The memory bound covers one evaluation batch (issue 46, item 2): a workload that declares
eval_batch evaluates at it whatever the training's batch, so the probe measures that pass
once (the model, its gradients and optimizer state, a forward without autograd) and the
search stops before any trial when it does not fit, naming eval_batch. Without Ray: the
probe's task body, the bounds' check."""

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tula_ray.failures import UserCodeError
from tula_ray.planning import bounds
from tula_ray.training import probe_task
from tula_ray.training.host_allocator import node_memory_bytes
from tula_ray.workloads import Workload
from trainables.memory_probe import _check_and_measure  # the probe's task body, no Ray

GB = 1e9


def images() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn((64, 3, 16, 16), generator=generator),
                         torch.randint(0, 5, (64,), generator=generator))


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * 16 * 16, 5))


WORKLOAD = Workload("user-cnn", model, images, images, epochs=1, sample_shape=(3, 16, 16),
                    num_classes=5)
EXAMPLE = (torch.randn(2, 3, 16, 16), torch.tensor([0, 1]))


def test_the_evaluation_peak_holds_the_model_its_state_and_grows_with_eval_batch():
    state = sum(p.numel() * p.element_size() for p in model().parameters())
    small = probe_task.evaluation_peak_bytes(WORKLOAD, 8, "cpu", EXAMPLE)
    large = probe_task.evaluation_peak_bytes(WORKLOAD, 512, "cpu", EXAMPLE)
    assert small >= 2 * state  # the weights and the last step's gradients, at least
    # 504 more samples through the first convolution's 16 x 16 x 16 floats, at least
    assert large - small >= 504 * 16 * 16 * 16 * 4


def test_the_probe_measures_the_evaluation_only_for_a_declared_eval_batch():
    plain = _check_and_measure(WORKLOAD, {}, [2, 4], False)
    assert "eval_peak_bytes" not in plain and bounds.fitted_probe(plain).eval_peak_bytes is None
    declared = dataclasses.replace(WORKLOAD, eval_batch=256)
    measured = _check_and_measure(declared, {}, [2, 4], False)
    assert measured["eval_peak_bytes"] > max(measured["peaks"])  # 256 samples against 4
    assert bounds.fitted_probe(measured).eval_peak_bytes == measured["eval_peak_bytes"]


def _probe(eval_batch, eval_peak_bytes):
    return bounds.MemoryProbe(params=None, rows=[], eval_peak_bytes=eval_peak_bytes,
                              workload=dataclasses.replace(WORKLOAD, eval_batch=eval_batch))


def test_an_eval_batch_that_does_not_fit_stops_the_search_naming_it():
    bounds.check_evaluation_fits(_probe(None, None), 1 * GB, headroom=0.1)  # evaluates at b
    bounds.check_evaluation_fits(_probe(4096, 0.89 * GB), 1 * GB, headroom=0.1)  # fits
    with pytest.raises(ValueError, match=r"eval_batch=4096 does not fit: evaluating one "
                                         r"batch on a worker needs 0\.95 GB .* allows "
                                         r"0\.9 GB \(1 GB, headroom 10%\); lower the "
                                         r"workload's eval_batch"):
        bounds.check_evaluation_fits(_probe(4096, 0.95 * GB), 1 * GB, headroom=0.1)
    with pytest.raises(ValueError, match="eval_batch=4096 does not fit: evaluating one batch "
                                         "on a worker does not fit the device's memory"):
        bounds.check_evaluation_fits(_probe(4096, None), 1 * GB, headroom=0.1)


def test_out_of_memory_in_the_evaluation_reads_none_and_the_models_own_error_is_named(
        monkeypatch):
    declared = dataclasses.replace(WORKLOAD, eval_batch=64)

    def runs_out(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    real = probe_task.evaluation_peak_bytes
    monkeypatch.setattr(probe_task, "evaluation_peak_bytes", runs_out)
    assert probe_task.evaluation_peak_or_none(declared, "cpu", EXAMPLE) is None
    monkeypatch.setattr(probe_task, "evaluation_peak_bytes", real)

    def refuses_large_batches() -> nn.Module:
        class Refusing(nn.Module):
            def forward(self, inputs):
                if inputs.shape[0] > 32:
                    raise RuntimeError("this model takes at most 32 samples")
                return model()(inputs)
        return Refusing()

    refusing = dataclasses.replace(declared, model_fn=refuses_large_batches)
    with pytest.raises(UserCodeError, match="evaluation at eval_batch 64"):
        probe_task.evaluation_peak_or_none(refusing, "cpu", EXAMPLE)


def test_on_a_cpu_an_eval_batch_larger_than_the_nodes_ram_is_not_tried(monkeypatch):
    """Its inputs alone would not fit: None (read as not fitting), before any allocation."""
    calls = []
    monkeypatch.setattr(probe_task, "evaluation_peak_bytes",
                        lambda *args: calls.append(args) or 1.0)
    ram = node_memory_bytes()
    per_sample = WORKLOAD.input_bytes_per_sample  # 3 x 16 x 16 float32
    huge = dataclasses.replace(WORKLOAD, eval_batch=ram // per_sample + 1)
    assert probe_task.evaluation_peak_or_none(huge, "cpu", EXAMPLE) is None and not calls
    fits = dataclasses.replace(WORKLOAD, eval_batch=64)
    probe_task.evaluation_peak_or_none(fits, "cpu", EXAMPLE)
    assert len(calls) == 1
