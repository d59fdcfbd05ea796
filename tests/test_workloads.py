"""Workloads and measurement, without Ray."""

from __future__ import annotations

import functools

import pytest
import torch

from tula_ray.workloads import datasets
from tula_ray.training import measure
from tula_ray.failures import UserCodeError
from tula_ray.workloads.check import checked, inspect_workload
from tula_ray.workloads.check import complete as complete_workload
from tula_ray.workloads import WORKLOADS, FashionCNN, Workload, get_workload, resolve_workload


# ----------------------------------------------------------------- registry

def test_registry_names_and_aliases():
    assert "fashion-mnist-cnn" in WORKLOADS
    for arch in ("resnet18", "resnet50", "vgg11", "alexnet", "mobilenet_v3_small"):
        assert f"{arch}-fashion-mnist" in WORKLOADS
        assert get_workload(arch).name == f"{arch}-fashion-mnist"
    fake = get_workload("fashion-mnist-cnn-fake")
    assert fake.name == "fashion-mnist-cnn-fake"
    assert get_workload("fashion-mnist-cnn", data="fake").name == fake.name
    assert get_workload("fashion-mnist-cnn").dataset_size == 60_000  # known without loading


def test_unknown_workload_lists_known_names():
    with pytest.raises(ValueError, match="unknown.*fashion-mnist-cnn"):
        get_workload("no-such-model")


@pytest.mark.parametrize("options, match", [
    ({"data": "imagenet"}, "data='imagenet'"),
    ({"colour": True}, "'colour' is unknown"),
    ({"train_subset": 0}, "train_subset=0"),
    ({"train_subset": 60_001}, "train_subset=60001"),
    ({"data": "fake", "train_subset": 10}, "fake_size"),
])
def test_bad_options_name_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        get_workload("fashion-mnist-cnn", **options)


def test_paper_optimizer_defaults():
    model = torch.nn.Linear(2, 2)
    group = get_workload("fashion-mnist-cnn-fake").optimizer_fn(model.parameters()).param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.01, 0.9, 5e-4)
    resnet50 = get_workload("resnet50-fake").optimizer_fn(model.parameters())
    assert resnet50.param_groups[0]["lr"] == 0.05
    mobilenet = get_workload("mobilenet_v3_small-fake").optimizer_fn(model.parameters())
    assert mobilenet.param_groups[0]["weight_decay"] == 1e-4


def test_a_workload_takes_the_users_optimizer_and_epochs():
    adam = functools.partial(torch.optim.Adam, lr=3e-4)
    workload = get_workload("fashion-mnist-cnn-fake", optimizer_fn=adam, epochs=3)
    optimizer = workload.optimizer_fn(torch.nn.Linear(2, 2).parameters())
    assert isinstance(optimizer, torch.optim.Adam) and workload.epochs == 3


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_fake_data_forward_shapes(name):
    workload = get_workload(name, data="fake", fake_size=8)
    dataset = workload.train_dataset_fn()
    assert len(dataset) == workload.dataset_size == 8
    inputs, labels = dataset[:4]
    assert tuple(inputs.shape[1:]) == workload.sample_shape == (1, 28, 28)
    assert labels.dtype == torch.long and 0 <= int(labels.min()) and int(labels.max()) < 10
    with torch.no_grad():
        assert workload.model_fn().eval()(inputs).shape == (4, workload.num_classes)


def test_fake_data_is_deterministic_and_splits_differ():
    a, b = datasets.fake_data(True, 4), datasets.fake_data(True, 4)
    assert torch.equal(a.tensors[0], b.tensors[0])
    assert not torch.equal(a.tensors[0], datasets.fake_data(False, 4).tensors[0])


def test_custom_workload_size_is_lazy_and_resolve():
    dataset = datasets.fake_data(True, 6)
    calls = []
    custom = Workload("custom", FashionCNN, lambda: calls.append(1) or dataset,
                      lambda: dataset)
    assert custom.dataset_size == 6 and custom.dataset_size == 6 and len(calls) == 1
    with pytest.raises(ValueError, match="sample_shape is not known yet"):
        custom.input_bytes_per_sample
    assert checked(custom).input_bytes_per_sample == 28 * 28 * 4
    assert resolve_workload(custom) is custom
    assert resolve_workload("fashion-mnist-cnn", {"data": "fake"}).name == "fashion-mnist-cnn-fake"
    with pytest.raises(ValueError, match="workload_options"):
        resolve_workload(custom, {"data": "fake"})


def _rgb_model():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 10 * 10, 6))


def _rgb_data():
    return torch.utils.data.TensorDataset(torch.zeros(5, 3, 12, 12), torch.zeros(5).long())


def test_a_users_workload_takes_its_shapes_from_its_data_and_model():
    """A 3-channel model on 12 x 12 images with 6 outputs, no shapes given: the probe's
    batches must have the data's shape (not Fashion-MNIST's) and the model's class count."""
    custom = Workload("rgb", _rgb_model, _rgb_data)  # no test data: a search needs none
    complete = checked(custom)
    assert (complete.sample_shape, complete.num_classes) == ((3, 12, 12), 6)
    assert complete.input_dtype == torch.float32
    assert complete.input_bytes_per_sample == 3 * 12 * 12 * 4
    assert complete.dataset_size == 5
    assert measure.peak_memory_bytes(complete, 4, device="cpu") > 0
    assert repr(complete) == "Workload('rgb')"  # one short line in Tune's output and logs


@pytest.mark.parametrize("fields, match", [
    ({"sample_shape": (1, 28, 28)}, r"sample_shape=\(1, 28, 28\), but its first training "
                                    r"sample's input has shape \(3, 12, 12\)"),
    ({"num_classes": 7}, "num_classes=7, but the model outputs 6"),
])
def test_wrong_shapes_are_named_before_any_worker_sees_them(fields, match):
    with pytest.raises(ValueError, match=match):
        checked(Workload("rgb", **{"model_fn": _rgb_model, "train_dataset_fn": _rgb_data,
                                   **fields}))


class _TokenClassifier(torch.nn.Module):
    """Integer token ids in, class scores out: random float inputs would crash it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1))


def _tokens():
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randint(0, 50, (20, 7), generator=generator),
                                          torch.randint(0, 3, (20,), generator=generator))


def test_integer_token_inputs_are_checked_and_probed_with_their_own_dtype():
    """Issue 22, item 2: the check takes the first sample's shape and dtype; the memory
    probe tiles it, so an embedding model is measured on token ids, not random floats."""
    workload = Workload("tokens", _TokenClassifier, _tokens)
    facts = inspect_workload(workload)
    assert facts.sample_shape == (7,) and facts.input_dtype == torch.int64
    assert facts.num_outputs == 3 and facts.train_size == 20
    complete = complete_workload(workload, facts)
    assert complete.input_bytes_per_sample == 7 * 8
    small, large = (measure.peak_memory_bytes(complete, b, device="cpu", example=facts.example)
                    for b in (4, 64))
    assert 0 < small < large
    inputs, targets = measure.tiled_batch(facts.example, 5)
    assert inputs.shape == (5, 7) and inputs.dtype == torch.int64 and targets.shape == (5,)
    with pytest.raises(RuntimeError, match="indices"):  # what random float batches do to it
        measure.peak_memory_bytes(complete, 4, device="cpu",
                                  example=measure.synthetic_batch((7,), 3, 2))


def _raises(error: Exception):
    def function(*args, **kwargs):
        raise error
    return function


@pytest.mark.parametrize("fields, stage, raised", [
    ({"train_dataset_fn": _raises(FileNotFoundError("no images under /data/my-images"))},
     r"train_dataset_fn\(\)", "FileNotFoundError: no images under /data/my-images"),
    ({"model_fn": _raises(ImportError("No module named 'my_models'"))}, r"model_fn\(\)",
     "ImportError: No module named 'my_models'"),
    ({"model_fn": lambda: torch.nn.Sequential(_Raising(), _rgb_model())},
     "the model's forward", "ValueError: a broken forward"),
    ({"loss_fn": lambda: _raises(RuntimeError("loss exploded"))}, r"loss_fn\(\)",
     "RuntimeError: loss exploded"),
])
def test_the_workloads_own_code_failing_is_a_user_code_error_with_its_traceback(
        fields, stage, raised):
    workload = Workload("rgb", **{"model_fn": _rgb_model, "train_dataset_fn": _rgb_data,
                                  **fields})
    with pytest.raises(UserCodeError, match=f"workload 'rgb': {stage}.* raised {raised}") as info:
        inspect_workload(workload)
    assert "Traceback (most recent call last)" in info.value.traceback_text
    assert str(info.value).startswith(info.value.message) and raised in str(info.value)
    assert "Traceback where it ran" in str(info.value)


class _Raising(torch.nn.Module):
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        raise ValueError("a broken forward")


# ----------------------------------------------------------------- measure

def test_cpu_peak_memory_grows_with_batch():
    workload = get_workload("fashion-mnist-cnn-fake")
    small, large = (measure.peak_memory_bytes(workload, b, device="cpu") for b in (8, 64))
    params = sum(p.numel() * 4 for p in workload.model_fn().parameters())
    assert 3 * params <= small < large  # params + grads + momentum, then activations
    # Activations + the batch itself are linear in b: at least the input bytes per sample.
    assert (large - small) / 56 >= workload.input_bytes_per_sample


def test_peak_memory_of_given_parts_and_errors():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    parts = (model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss())
    assert measure.peak_memory_bytes(parts, 4, device="cpu", sample_shape=(1, 28, 28),
                                     num_classes=10) > 784 * 10 * 4
    with pytest.raises(ValueError, match="sample_shape"):
        measure.peak_memory_bytes(parts, 4, device="cpu")
    with pytest.raises(ValueError, match="local_batch=0"):
        measure.peak_memory_bytes(parts, 0, device="cpu")


def test_step_timer_times_a_train_step():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = measure.synthetic_batch((4,), 3, 5)
    with measure.StepTimer("cpu") as timer:
        loss = measure.train_step(model, optimizer, torch.nn.CrossEntropyLoss(), inputs, targets)
    assert timer.seconds > 0 and loss.requires_grad is False


@pytest.mark.parametrize("eval_batch, error", [(0, ValueError), (2.5, TypeError)])
def test_a_bad_eval_batch_is_refused_naming_it(eval_batch, error):
    with pytest.raises(error, match=f"eval_batch={eval_batch}; it must be an integer >= 1 "
                                    "or None"):
        Workload("mine", torch.nn.Linear, list, eval_batch=eval_batch)
