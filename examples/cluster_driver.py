"""A user's driver script: its own model and data as a `Workload`, one search on a Ray cluster.

    # on the head of a cluster (`ray up`, then `ray attach`):
    python cluster_driver.py --address auto --storage-path /shared/runs --out /shared/plan
    # or from anywhere that reaches the dashboard, as a Ray job:
    ray job submit --address http://HEAD:8265 --working-dir examples -- \\
        python cluster_driver.py --storage-path /shared/runs --out /shared/plan

`tula_ray.search` joins the cluster the driver runs on: the `--address` given, else
RAY_ADDRESS (which `ray job submit` sets for the job), else it would start a local Ray.
The model and the data live in this file, so Ray ships them to the workers by value
(functions of `__main__` are pickled with their code): nothing to install on the nodes
but tula-ray itself. The data are random tensors with a learnable rule, so the script
needs no download; the grid is tiny (one batch size), so a search takes a minute or two.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray.workloads import Workload

SAMPLE_SHAPE = (1, 8, 8)
NUM_CLASSES = 4
TRAIN_SAMPLES, TEST_SAMPLES = 512, 128


def tiny_model() -> nn.Module:
    """A two-layer MLP over 8 x 8 single-channel inputs."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))


def random_dataset(train: bool) -> TensorDataset:
    """Seeded random inputs labelled by a fixed random linear rule (learnable, no download)."""
    generator = torch.Generator().manual_seed(0 if train else 1)
    inputs = torch.randn(TRAIN_SAMPLES if train else TEST_SAMPLES, *SAMPLE_SHAPE,
                         generator=generator)
    rule = torch.randn(64, NUM_CLASSES, generator=torch.Generator().manual_seed(2))
    return TensorDataset(inputs, (inputs.flatten(1) @ rule).argmax(dim=1))


def tiny_workload() -> Workload:
    return Workload("tiny-mlp", tiny_model, functools.partial(random_dataset, True),
                    functools.partial(random_dataset, False), epochs=1,
                    sample_shape=SAMPLE_SHAPE, num_classes=NUM_CLASSES, train_size=TRAIN_SAMPLES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join ('auto' on a cluster's head; default "
                             "$RAY_ADDRESS)")
    parser.add_argument("--cluster-sizes", type=int, nargs="+", default=[2])
    parser.add_argument("--batch", type=int, default=32, help="the one global batch size tried")
    parser.add_argument("--storage-path", default=None,
                        help="where Tune keeps the trials: on a multi-node cluster a path "
                             "every node reaches (shared file system) or a cloud URI")
    parser.add_argument("--name", default=None, help="experiment name (default: dated)")
    parser.add_argument("--out", type=Path, default=Path("plan"))
    args = parser.parse_args(argv)

    plan = tula_ray.search(
        tiny_workload(), cluster_sizes=tuple(args.cluster_sizes), min_batch=args.batch,
        max_batch=args.batch, search_strategy="full", objective="time", warmup_steps=1,
        measure_steps=2, storage_path=args.storage_path, name=args.name, address=args.address)
    print(plan.summary())
    args.out.mkdir(parents=True, exist_ok=True)
    plan.to_json(args.out / "plan.json")
    print(f"wrote {args.out / 'plan.json'}")


if __name__ == "__main__":
    main()
