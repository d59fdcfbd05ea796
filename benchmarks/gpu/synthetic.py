"""The GPU acceptance run's workloads (both halves): the CNN or a torchvision model on
Fashion-MNIST-shaped random data in memory, so that a GPU machine needs no download."""

from __future__ import annotations

import functools

import torch
from torch.utils.data import TensorDataset

EPOCHS = 3
TEST_SAMPLES = 2000  # the synthetic test set each `fit` epoch is scored on


@functools.lru_cache(maxsize=2)  # the bound check's 500k images: made once, not per use
def synthetic_data(samples: int, seed: int = 0) -> TensorDataset:
    """Fashion-MNIST-shaped random images and labels, in memory (no download)."""
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 1, 28, 28, generator=generator),
                         torch.randint(0, 10, (samples,), generator=generator))


def synthetic_workload(name: str, samples: int, precision: str = "fp32",
                       test_samples: int = TEST_SAMPLES):
    from tula_ray.workloads import FashionCNN, Workload
    from tula_ray.workloads.workload import torchvision_model

    model_fn = FashionCNN if name == "cnn" else functools.partial(torchvision_model, name)
    return Workload(f"{name}-synthetic", model_fn=model_fn,
                    train_dataset_fn=functools.partial(synthetic_data, samples),
                    test_dataset_fn=functools.partial(synthetic_data, test_samples, 1),
                    epochs=EPOCHS,
                    train_size=samples, sample_shape=(1, 28, 28), num_classes=10,
                    precision=precision)
