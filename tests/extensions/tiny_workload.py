"""A workload of one's own: a small MLP on 10-class data made in memory (no files)."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray

SAMPLES, FEATURES, CLASSES = 512, 16, 10


def _data(seed, count=SAMPLES):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(count, FEATURES, generator=generator)
    return TensorDataset(inputs, (inputs[:, :CLASSES].argmax(dim=1)))


def train_data():
    return _data(0)


def test_data():
    return _data(1, 256)


def model():
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def tiny_mlp(epochs=1):
    return tula_ray.Workload("tiny-mlp", model, train_data, test_dataset_fn=test_data,
                             epochs=epochs)


tula_ray.register_workload("tiny-mlp", tiny_mlp)
