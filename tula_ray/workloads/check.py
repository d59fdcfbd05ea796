"""Checking a workload where its workers run, before any of them is launched (issue 22, item 2).

`inspect_workload` does, in the process it is called in (a Ray task with a worker's
resources, for the entry points), what every worker is about to do: load the training
data, take its first samples, build the model, run one forward, the loss, one backward
and one optimizer step. What it learns (`WorkloadFacts`: the input's shape and dtype,
the width of the model's output, the training set's size, and the first samples, which
the memory probe tiles into batches of the real dtype) completes the workload
(`complete`). An exception of the workload's own code leaves as a `UserCodeError`
naming the workload and the stage, with the traceback of the process it ran in; a
workload that contradicts itself (a declared shape its data do not have) is a
ValueError naming the field. Core module: no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch.utils.data import default_collate

from tula_ray.failures import workload_code
from tula_ray.precision import check_precision_on_device
from tula_ray.workloads.workload import Workload

EXAMPLE_SAMPLES = 2  # samples in the check's batch: BatchNorm needs more than one to train


@dataclass(frozen=True)
class WorkloadFacts:
    """What one check of a workload learned."""

    sample_shape: tuple[int, ...]  # one input, without the batch dimension
    input_dtype: torch.dtype  # e.g. float32 images, int64 token ids
    num_outputs: int  # the model's output width: scores per sample
    train_size: int  # len(train dataset)
    example: tuple[torch.Tensor, torch.Tensor]  # the first samples (inputs, targets), batched

    @property
    def input_bytes_per_sample(self) -> int:
        """Bytes of one input as the data give it: M_batch / b of eq. 3."""
        return math.prod(self.sample_shape) * self.input_dtype.itemsize


def inspect_workload(workload: Workload, device: torch.device | str = "cpu") -> WorkloadFacts:
    """Load the first training samples, build the model and train one step on them on
    `device` (module docstring). Raises UserCodeError for the workload's own code,
    ValueError for data or outputs no training step can use, or for a precision the
    device lacks (`check_precision_on_device`)."""
    check_precision_on_device(workload.precision, device)
    name = workload.name
    with workload_code(name, "train_dataset_fn()"):
        dataset = workload.train_dataset_fn()
    with workload_code(name, "len(train dataset)"):
        size = len(dataset)  # type: ignore[arg-type]
    if size == 0:
        raise ValueError(f"workload {name!r}: train_dataset_fn() returned an empty dataset")
    with workload_code(name, "train dataset[i], collated as a DataLoader does"):
        inputs, targets = _inputs_and_targets(
            name, default_collate([dataset[i] for i in range(min(EXAMPLE_SAMPLES, size))]))
    device = torch.device(device)
    with workload_code(name, "model_fn()"):
        model = workload.model_fn().to(device)
        model.train()
    with workload_code(name, "the model's forward on its first training samples"):
        outputs = model(inputs.to(device))
    if not isinstance(outputs, torch.Tensor) or outputs.ndim != 2:
        shape = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise ValueError(f"workload {name!r}: the model's output is {shape} for a batch of "
                         f"{len(inputs)}; a classifier's output is (batch, num_classes)")
    with workload_code(name, "loss_fn() on the model's outputs"):
        loss = workload.loss_fn()(outputs, targets.to(device))
    with workload_code(name, "the backward of the loss"):
        loss.backward()
    with workload_code(name, "optimizer_fn(model.parameters()).step()"):
        workload.optimizer_fn(model.parameters()).step()
    return WorkloadFacts(tuple(int(d) for d in inputs.shape[1:]), inputs.dtype,
                         int(outputs.shape[1]), int(size), (inputs.cpu(), targets.cpu()))


def _inputs_and_targets(name: str, batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ValueError(f"workload {name!r}: a training sample must be (input, target); "
                         f"train_dataset_fn()'s give {type(batch).__name__}s")
    inputs, targets = batch
    if not isinstance(inputs, torch.Tensor):
        raise ValueError(f"workload {name!r}: a training sample's input is a "
                         f"{type(inputs).__name__}, not a tensor; give a dataset of tensors")
    return inputs, torch.as_tensor(targets)


def complete(workload: Workload, facts: WorkloadFacts) -> Workload:
    """`workload` with what the check learned filled in: sample_shape and num_classes
    where they were None, the input dtype and the training set's size. A declared value
    the data or the model contradict is a ValueError naming the field."""
    name, shape, classes = workload.name, workload.sample_shape, workload.num_classes
    if shape is not None and tuple(shape) != facts.sample_shape:
        raise ValueError(f"workload {name!r}: sample_shape={tuple(shape)}, but its first "
                         f"training sample's input has shape {facts.sample_shape}; set "
                         "sample_shape to the shape of one input, or leave it None to take "
                         "it from the data")
    if classes is not None and not 1 <= classes <= facts.num_outputs:
        raise ValueError(f"workload {name!r}: num_classes={classes!r}, but the model outputs "
                         f"{facts.num_outputs} scores per sample; give num_classes <= "
                         f"{facts.num_outputs} (or None: taken from the model)")
    return replace(workload, sample_shape=facts.sample_shape, input_dtype=facts.input_dtype,
                   num_classes=facts.num_outputs if classes is None else classes,
                   train_size=facts.train_size)


def checked(workload: Workload, device: torch.device | str = "cpu") -> Workload:
    """`complete(workload, inspect_workload(workload))`, in this process."""
    return complete(workload, inspect_workload(workload, device))
