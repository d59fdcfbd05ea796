"""Offline datasets for the built-in workloads: Fashion-MNIST and torchvision FakeData.

Images are decoded once into normalised float TensorDatasets, so that a
training step costs the model, not per-item PIL transforms. Where Fashion-MNIST's
files come from (a directory, Debian's package, the cache, a download) is
`tula_ray.workloads.fashion_mnist_files`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from tula_ray.arguments import check_int
from tula_ray.workloads.fashion_mnist_files import cache_dir, locate

logger = logging.getLogger(__name__)

# torchvision is imported inside the functions that need it: importing it costs
# ~2 s (it pulls in torch._dynamo), paid by every Ray process that unpickles a
# trainable (trial driver, Train controller) although only workers load data.

NUM_CLASSES = 10
SAMPLE_SHAPE = (1, 28, 28)  # Fashion-MNIST: one channel, 28 x 28
FASHION_MNIST_TRAIN_SIZE = 60_000
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530  # of the training images
FAKE_SIZE_DEFAULT = 1024  # FakeData samples: enough for a few steps at B = 256
FAKE_TEST_OFFSET = 10**6  # FakeData seeds sample i with i + offset: keep test seeds apart


@functools.lru_cache(maxsize=4)
def _fashion_mnist_tensors(root: str, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised float images (n, 1, 28, 28) and labels, loaded once per process.

    Decoded by torchvision once per machine, then kept in the cache as uint8 tensors
    (`torch.save`): the Ray workers of every later launch load them without importing
    torchvision, which costs each of them ~1.3 s (of a profiling launch's ~10 s)."""
    path = _decoded_path(root, train)
    try:
        images, labels = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError):  # absent or unreadable: decode
        import torchvision

        data = torchvision.datasets.FashionMNIST(root, train=train, download=False)
        images, labels = data.data, data.targets
        _save_atomically((images, labels), path)
    images = (images.unsqueeze(1).float() / 255.0 - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
    return images, labels.long()


def _decoded_path(root: str, train: bool) -> Path:
    """Where `root`'s decoded split is kept: named after its idx files' path, size and
    modification time, so that other or replaced files are decoded again."""
    prefix = "train" if train else "t10k"
    raw = Path(root) / "FashionMNIST" / "raw"
    stamp = [str(raw.resolve())]
    for name in (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"):
        stat = (raw / name).stat()
        stamp += [name, str(stat.st_size), str(stat.st_mtime_ns)]
    key = hashlib.sha256("\0".join(stamp).encode()).hexdigest()[:16]
    return cache_dir() / "decoded" / f"{prefix}-{key}.pt"


def _save_atomically(tensors: tuple[torch.Tensor, ...], path: Path) -> None:
    """torch.save to a temporary file, then rename: a worker never reads half a file.
    A cache that cannot be written (read-only home) only costs the next decode."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as stream:
            torch.save(tensors, stream)
        os.replace(temporary, path)
    except OSError as exc:
        logger.warning("could not keep decoded Fashion-MNIST in %s: %s", path.parent, exc)


def fashion_mnist(train: bool = True, root: str | None = None, train_subset: int | None = None,
                  subset_seed: int | None = None) -> TensorDataset:
    """Fashion-MNIST as a TensorDataset; `train_subset` keeps k training images
    (the first k, or k drawn with `subset_seed`)."""
    images, labels = _fashion_mnist_tensors(str(locate(root).root), train)
    if train and train_subset is not None:
        keep = _subset_indices(len(images), train_subset, subset_seed)
        images, labels = images[keep], labels[keep]
    return TensorDataset(images, labels)


def check_subset(size: int, k: int) -> None:
    """Raise TypeError (not an integer) or ValueError (out of range) unless k is a valid
    subset size of a dataset of `size` samples."""
    check_int("train_subset", k, minimum=1, maximum=size)


def _subset_indices(size: int, k: int, seed: int | None) -> torch.Tensor:
    check_subset(size, k)
    if seed is None:
        return torch.arange(k)
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:k]


def fake_data(train: bool = True, size: int = FAKE_SIZE_DEFAULT,
              sample_shape: tuple[int, ...] = SAMPLE_SHAPE) -> TensorDataset:
    """torchvision FakeData, deterministic (test split offset), as a TensorDataset."""
    import torchvision

    data = torchvision.datasets.FakeData(
        size=size, image_size=sample_shape, num_classes=NUM_CLASSES,
        transform=torchvision.transforms.ToTensor(),
        random_offset=0 if train else FAKE_TEST_OFFSET)
    images, labels = zip(*(data[i] for i in range(size)))
    return TensorDataset((torch.stack(images) - 0.5) / 0.5, torch.tensor(labels))
