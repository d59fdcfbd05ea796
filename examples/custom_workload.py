"""Search (and optionally train) your own model on your own data with tula-ray.

    python examples/custom_workload.py --out plan             # search on a local Ray
    python examples/custom_workload.py --out plan --train 1   # then train the choice 1 epoch

This script is the whole of what a user writes: a model factory, a dataset
factory and a `tula_ray.workloads.Workload` that names them. Everything is
defined here, in the driver: Ray ships these functions to its workers by value.
The data are made up (coloured 16 x 16 images whose class is their dominant
colour channel) so that the example runs anywhere, offline; put your own
`Dataset` in `train_data` / `test_data`.

sample_shape and num_classes are not given: tula-ray takes them from the first
training sample and from the model's output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray.cluster import ray_session
from tula_ray.workloads import Workload

NUM_CLASSES = 3  # red, green or blue dominates
IMAGE_SIZE = 16


def make_images(count: int, seed: int) -> TensorDataset:
    """`count` RGB images; the label is the channel with the largest mean."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand((count, 3, IMAGE_SIZE, IMAGE_SIZE), generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (count,), generator=generator)
    images[torch.arange(count), labels] += 0.5  # brighten the label's channel
    return TensorDataset(images, labels)


def train_data() -> TensorDataset:
    return make_images(2048, seed=0)


def test_data() -> TensorDataset:
    return make_images(512, seed=1)


def model() -> nn.Module:
    """A small 3-channel CNN: the kind of model a user brings."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, NUM_CLASSES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("plan"))
    parser.add_argument("--cluster-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--measure-steps", type=int, default=8)
    parser.add_argument("--storage-path", type=Path, default=None)
    parser.add_argument("--train", type=int, default=0, metavar="EPOCHS",
                        help="then train the choice for this many epochs (0: do not train)")
    args = parser.parse_args()

    workload = Workload("rgb-cnn", model_fn=model, train_dataset_fn=train_data,
                        test_dataset_fn=test_data, epochs=10)
    storage = str(args.storage_path.resolve()) if args.storage_path else None
    with ray_session():  # one local Ray for the search and the training
        plan = tula_ray.search(workload, cluster_sizes=tuple(args.cluster_sizes),
                               max_batch=args.max_batch, objective="time",
                               measure_steps=args.measure_steps, storage_path=storage)
        print(plan.summary())
        plan.to_json(args.out / "plan.json")
        if args.train:
            result = tula_ray.train(plan, workload=workload, epochs=args.train,
                                    storage_path=storage)
            print(result.metrics[["epoch", "train_loss", "test_accuracy"]].to_string(index=False))
            result.metrics.to_csv(args.out / "train_metrics.csv", index=False)


if __name__ == "__main__":
    main()
