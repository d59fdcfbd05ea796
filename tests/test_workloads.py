"""Workloads and measurement, without Ray."""

from __future__ import annotations

import functools
import gzip
import struct
from pathlib import Path

import pytest
import torch

from tula_ray import datasets, measure
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
    assert custom.input_bytes_per_sample == 28 * 28 * 4
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
    complete = custom.with_shapes()
    assert (complete.sample_shape, complete.num_classes) == ((3, 12, 12), 6)
    assert complete.input_bytes_per_sample == 3 * 12 * 12 * 4
    assert complete.dataset_size == 5 and complete.with_shapes() is complete
    assert measure.peak_memory_bytes(complete, 4, device="cpu") > 0
    assert repr(complete) == "Workload('rgb')"  # one short line in Tune's output and logs


@pytest.mark.parametrize("fields, match", [
    ({"sample_shape": (1, 28, 28)}, r"sample_shape=\(1, 28, 28\)"),
    ({"num_classes": 7}, "num_classes=7, but the model outputs 6"),
    ({"model_fn": lambda: torch.nn.Conv2d(3, 2, 3)}, r"output has shape \(2, 2, 10, 10\)"),
])
def test_wrong_shapes_are_named_before_any_worker_sees_them(fields, match):
    with pytest.raises(ValueError, match=match):
        Workload("rgb", **{"model_fn": _rgb_model, "train_dataset_fn": _rgb_data,
                           **fields}).with_shapes()


# ----------------------------------------------------------------- data directory

def _write_idx(directory: Path, n: int = 5, gz: bool = True) -> None:
    """Tiny valid idx files: image i is filled with value i, label i % 10."""
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", n), ("t10k", 2)):
        images = struct.pack(">IIII", 2051, count, 28, 28) + b"".join(
            bytes([i]) * 784 for i in range(count))
        labels = struct.pack(">II", 2049, count) + bytes(i % 10 for i in range(count))
        for kind, payload in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(payload))
            else:
                (directory / name).write_bytes(payload)


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Every place the resolver looks at, empty, and the download switched off."""
    dirs = {k: tmp_path / k for k in ("root", "env", "debian", "cache")}
    monkeypatch.setattr(datasets, "DEBIAN_DATA_DIR", dirs["debian"])
    monkeypatch.setenv(datasets.CACHE_DIR_ENV, str(dirs["cache"]))
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(dirs["env"]))

    def no_network(root):
        raise RuntimeError("network is unreachable")

    monkeypatch.setattr(datasets, "_download", no_network)
    return dirs


def test_nothing_found_is_a_clear_error(places):
    with pytest.raises(FileNotFoundError) as info:
        datasets.fashion_mnist_root(places["root"])
    message = str(info.value)
    for place in ("root", "env", "debian"):
        assert str(places[place]) in message
    assert "apt-get install dataset-fashion-mnist" in message and "TULA_DATA_DIR" in message
    assert "network is unreachable" in message


def test_user_root_comes_first(places):
    _write_idx(places["root"] / "FashionMNIST" / "raw", gz=False)
    _write_idx(places["env"])
    assert datasets.fashion_mnist_root(places["root"]) == places["root"]


def test_env_dir_then_debian_flat_gz_are_unpacked_into_cache(places, monkeypatch):
    _write_idx(places["debian"], n=7)
    _write_idx(places["env"], n=5)
    cache_root = places["cache"] / "tula-ray" / "fashion-mnist"
    assert datasets.fashion_mnist_root() == cache_root  # env's .gz unpacked into the cache
    assert len(datasets.fashion_mnist(True)) == 5
    assert not any(p.name.endswith("ubyte") for p in places["env"].iterdir())  # source untouched

    monkeypatch.delenv(datasets.DATA_DIR_ENV)
    monkeypatch.setenv(datasets.CACHE_DIR_ENV, str(places["cache"] / "second"))
    assert len(datasets.fashion_mnist(True)) == 7  # the Debian directory
    assert len(datasets.fashion_mnist(False)) == 2


def test_train_subset_first_or_seeded(places):
    _write_idx(places["env"], n=20)
    first = datasets.fashion_mnist(True, train_subset=4)
    assert first.tensors[1].tolist() == [0, 1, 2, 3]
    seeded = datasets.fashion_mnist(True, train_subset=4, subset_seed=1)
    assert seeded.tensors[1].tolist() == datasets.fashion_mnist(
        True, train_subset=4, subset_seed=1).tensors[1].tolist()
    assert seeded.tensors[1].tolist() != [0, 1, 2, 3]
    assert get_workload("fashion-mnist-cnn", train_subset=4).dataset_size == 4


@pytest.mark.skipif(not datasets.DEBIAN_DATA_DIR.is_dir(), reason="dataset-fashion-mnist absent")
def test_real_fashion_mnist_is_normalised():
    dataset = get_workload("fashion-mnist-cnn").train_dataset_fn()
    images = dataset.tensors[0]
    assert images.shape == (60_000, 1, 28, 28) and images.dtype == torch.float32
    assert abs(float(images.mean())) < 0.05 and abs(float(images.std()) - 1) < 0.05


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


def test_decoded_images_are_kept_so_later_processes_skip_torchvision(places):
    """The first load decodes with torchvision and keeps uint8 tensors in the cache; a
    later process (a Ray worker of the next launch) loads them without torchvision;
    replaced idx files are decoded again."""
    import subprocess
    import sys

    raw, root = places["root"] / "FashionMNIST" / "raw", str(places["root"])
    _write_idx(raw, n=6, gz=False)
    first = datasets.fashion_mnist(True, root=root)
    kept = list((places["cache"] / "tula-ray" / "fashion-mnist" / "decoded").glob("train-*.pt"))
    assert len(kept) == 1
    script = ("import sys, tula_ray.datasets as d; data = d.fashion_mnist(True, root=sys.argv[1]); "
              "print(len(data), 'torchvision' in sys.modules, float(data.tensors[0].sum()))")
    out = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:2] == ["6", "False"]
    assert float(out[2]) == pytest.approx(float(first.tensors[0].sum()), rel=1e-6)

    _write_idx(raw, n=9, gz=False)  # replaced files: another key, decoded again
    datasets._fashion_mnist_tensors.cache_clear()
    assert len(datasets.fashion_mnist(True, root=root)) == 9
