"""What to train: a model factory, datasets, loss, optimizer and epochs (DESIGN "workloads").

Built-ins (`WORKLOADS`, `get_workload`): a small CNN and torchvision models on
Fashion-MNIST (the one real image dataset available offline, NOTES-ENV), each
also on deterministic torchvision FakeData for tests (`data="fake"` or a
"-fake" name suffix); the data come from `tula_ray.workloads.datasets`.

Everything here is picklable (module-level functions + functools.partial):
Ray workers rebuild a workload from its name and options, or unpickle it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.utils.data import Dataset

from tula_ray.arguments import check_bool, check_int, check_text
from tula_ray.precision import PRECISION_DEFAULT, check_precision
from tula_ray.workloads.datasets import (FAKE_SIZE_DEFAULT, FASHION_MNIST_TRAIN_SIZE, NUM_CLASSES,
                                         SAMPLE_SHAPE, check_subset, fake_data, fashion_mnist)

EPOCHS_DEFAULT = 20  # the generalization runs of NOTES-ENV
# Paper §IV-B: SGD, momentum 0.9, lr 0.01 (ResNet50: 0.05), weight decay 5e-4 (MobileNetV3: 1e-4).
LR_DEFAULT, MOMENTUM_DEFAULT, WEIGHT_DECAY_DEFAULT = 0.01, 0.9, 5e-4
DATA_SOURCES = ("fashion-mnist", "fake")
FAKE_SUFFIX = "-fake"


def sgd(params: Iterable[nn.Parameter], lr: float = LR_DEFAULT, momentum: float = MOMENTUM_DEFAULT,
        weight_decay: float = WEIGHT_DECAY_DEFAULT) -> torch.optim.Optimizer:
    """The paper's optimizer (§IV-B): SGD with momentum and weight decay."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


@dataclass
class Workload:
    """One training job: build the model, the data, the loss and the optimizer.

    model_fn: a fresh, randomly initialised model. train_dataset_fn: a map-style
    dataset of (input, label); test_dataset_fn: the same for evaluation, needed by
    `tula_ray.train` only (a search without it leaves the evaluation pass out of its
    predicted times). optimizer_fn: params -> optimizer.
    sample_shape: (C, H, W) of one input, so that input bytes per sample are known
    without data; num_classes: the width of the model's output. Both are taken
    from the data and the model when left None, where the workers run, before any
    of them is launched (`tula_ray.workloads.check`), as is input_dtype (default float32).
    train_size: len(train dataset) when known without loading it (else measured once).

    How batches reach the device (`tula_ray.training.batches`, the one data path of
    training and profiling): in-memory tensors (a TensorDataset) are gathered by index,
    from a copy on the GPU when data_on_device (None: when they fit); any other Dataset
    goes through a DataLoader with loader_workers processes per rank (None: none on CPU,
    up to 4 on a GPU) and pin_memory (None: on a GPU).
    precision: what a step computes in, "fp32", "tf32", "bf16" or "fp16" (`tula_ray.precision`):
    the same in profiling and training.
    eval_batch: the batch `train` evaluates the test set in, per worker (and the search's
    estimate of that pass); None: the training's local batch, B / N, which the search
    bounded (a model that takes batches of at most some size is evaluated within it).
    val_dataset_fn: your own validation split, what `train(target_accuracy=)` (and
    `tune_training`) judge a run on; None: `validation_fraction` of the training set is
    held out (`tula_ray.training.data.split_validation`). Never the test set.
    """

    name: str
    model_fn: Callable[[], nn.Module]
    train_dataset_fn: Callable[[], Dataset]
    test_dataset_fn: Callable[[], Dataset] | None = None
    loss_fn: Callable[[], nn.Module] = nn.CrossEntropyLoss
    optimizer_fn: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = sgd
    epochs: int = EPOCHS_DEFAULT
    sample_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    train_size: int | None = None
    input_dtype: torch.dtype | None = None
    loader_workers: int | None = None
    pin_memory: bool | None = None
    data_on_device: bool | None = None
    precision: str = PRECISION_DEFAULT
    eval_batch: int | None = None
    val_dataset_fn: Callable[[], Dataset] | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_int("eval_batch", self.eval_batch, minimum=1, optional=True,
                  hint="samples per evaluation batch on one worker; None: the training's "
                       "local batch")
        check_int("loader_workers", self.loader_workers, minimum=0, optional=True,
                  hint="DataLoader processes per rank; None picks for the device")
        for name in ("pin_memory", "data_on_device"):
            check_bool(name, getattr(self, name), optional=True, hint="None: by the device")

    def __repr__(self) -> str:
        # The default dataclass repr spells out every function: one line of a log or
        # of Tune's output must stay one line.
        return f"Workload({self.name!r})"

    @property
    def dataset_size(self) -> int:
        """Number of training samples D (paper eq. 4a)."""
        if self.train_size is None:
            self.train_size = len(self.train_dataset_fn())  # type: ignore[arg-type]
        return self.train_size

    @property
    def input_bytes_per_sample(self) -> int:
        """Bytes of one input: M_batch / b of eq. 3 (labels are negligible)."""
        if self.sample_shape is None:
            raise ValueError(f"workload {self.name!r}: its sample_shape is not known yet; "
                             "tula_ray.workloads.check.checked(workload) takes it from the data")
        return math.prod(self.sample_shape) * (self.input_dtype or torch.float32).itemsize


# --------------------------------------------------------------------------- models

class FashionCNN(nn.Module):
    """Small CNN without BatchNorm: 2 conv + 2 fc, 0.22 M parameters.

    Sized like NOTES-ENV's generalization setup: ~150 us per training sample on
    this machine's 2 cores (~300 us on one thread).
    """

    def __init__(self, num_classes: int = NUM_CLASSES, in_channels: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 14
            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 14 -> 7
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# torchvision architectures and the square input size each needs: alexnet's
# stride-4 stem and vgg's five poolings shrink 28 px to nothing, so those get
# their inputs upsampled inside the model (no per-sample transform cost).
TORCHVISION_INPUT_SIZE = {"resnet18": None, "resnet50": None, "mobilenet_v3_small": None,
                          "vgg11": 32, "alexnet": 64}


def _first_conv_to_channels(model: nn.Module, in_channels: int) -> None:
    """Replace the first Conv2d (RGB stem) by the same conv over `in_channels` channels."""
    for name, conv in model.named_modules():
        if isinstance(conv, nn.Conv2d):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attr, nn.Conv2d(
                in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                conv.dilation, conv.groups, conv.bias is not None, conv.padding_mode))
            return
    raise ValueError(f"{type(model).__name__} has no Conv2d to adapt to {in_channels} channels")


def torchvision_model(arch: str, num_classes: int = NUM_CLASSES, in_channels: int = 1) -> nn.Module:
    """A randomly initialised torchvision `arch` for `in_channels` x 28 x 28 inputs."""
    if arch not in TORCHVISION_INPUT_SIZE:
        raise ValueError(f"torchvision architecture {arch!r} is not adapted here; "
                         f"known: {sorted(TORCHVISION_INPUT_SIZE)}")
    import torchvision  # here, not at the top: see tula_ray.workloads.datasets

    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    _first_conv_to_channels(model, in_channels)
    size = TORCHVISION_INPUT_SIZE[arch]
    if size is None:
        return model
    upsample = nn.Upsample(size=(size, size), mode="bilinear", align_corners=False)
    return nn.Sequential(upsample, model)


# --------------------------------------------------------------------------- registry

def _build(name: str, model_fn: Callable[[], nn.Module], default_optimizer_fn: Callable, *,
           data: str = "fashion-mnist", root: str | None = None, train_subset: int | None = None,
           subset_seed: int | None = None, fake_size: int = FAKE_SIZE_DEFAULT,
           **fields: Any) -> Workload:
    if data == "fake":
        if train_subset is not None:
            raise ValueError(f"train_subset={train_subset} applies to Fashion-MNIST; "
                             "with data='fake' set fake_size instead")
        train_fn = functools.partial(fake_data, True, fake_size)
        test_fn = functools.partial(fake_data, False, max(fake_size // 4, 1))
        size = fake_size
        name += FAKE_SUFFIX
    elif data == "fashion-mnist":
        train_fn = functools.partial(fashion_mnist, True, root, train_subset, subset_seed)
        test_fn = functools.partial(fashion_mnist, False, root)
        size = train_subset or FASHION_MNIST_TRAIN_SIZE
        if train_subset is not None:
            check_subset(FASHION_MNIST_TRAIN_SIZE, train_subset)  # fail here, not in a worker
    else:
        raise ValueError(f"data={data!r} is unknown; use one of {DATA_SOURCES}")
    unknown = sorted(set(fields) - {"loss_fn", "optimizer_fn", "epochs", "precision",
                                    "eval_batch"})
    if unknown:
        raise ValueError(f"workload option {unknown[0]!r} is unknown; allowed: data, root, "
                         "train_subset, subset_seed, fake_size, loss_fn, optimizer_fn, epochs, "
                         "precision, eval_batch")
    fields.setdefault("optimizer_fn", default_optimizer_fn)
    return Workload(name=name, model_fn=model_fn, train_dataset_fn=train_fn,
                    test_dataset_fn=test_fn, train_size=size, sample_shape=SAMPLE_SHAPE,
                    num_classes=NUM_CLASSES, **fields)


# Paper §IV-B: where a model's optimizer differs from the default `sgd`.
PAPER_OPTIMIZERS = {"resnet50": functools.partial(sgd, lr=0.05),
                    "mobilenet_v3_small": functools.partial(sgd, weight_decay=1e-4)}

WORKLOADS: dict[str, Callable[..., Workload]] = {
    "fashion-mnist-cnn": functools.partial(_build, "fashion-mnist-cnn", FashionCNN, sgd),
    **{f"{arch}-fashion-mnist": functools.partial(
        _build, f"{arch}-fashion-mnist", functools.partial(torchvision_model, arch),
        PAPER_OPTIMIZERS.get(arch, sgd)) for arch in TORCHVISION_INPUT_SIZE},
}


BUILT_IN_WORKLOADS = frozenset(WORKLOADS)  # names every process knows without a user's module


def register_workload(name: str, factory: Callable[..., Workload]) -> None:
    """Add a workload by name: `factory(**workload_options)` returns a `Workload`.

    The name then works wherever a built-in's does (search, train, the CLI's configs). Ray
    workers receive the Workload the factory built, not the name (they have not run the
    module that registered it), so it must pickle as any workload a driver defines.
    """
    check_text("name", name, hint="the workload's name")
    if name in BUILT_IN_WORKLOADS:
        raise ValueError(f"workload {name!r} is built in; register yours under another name")
    if not callable(factory):
        raise TypeError(f"factory for workload {name!r} must be callable, "
                        f"not {type(factory).__name__}")
    WORKLOADS[name] = factory


def get_workload(name: str, **options: Any) -> Workload:
    """A built-in workload by name; options: data ("fashion-mnist" | "fake"), root,
    train_subset, subset_seed, fake_size, and Workload fields (epochs, loss_fn, optimizer_fn,
    precision, eval_batch).

    "<name>-fake" means data="fake"; a bare architecture ("resnet18") means its
    Fashion-MNIST workload.
    """
    key = name
    if key.endswith(FAKE_SUFFIX):
        key = key[: -len(FAKE_SUFFIX)]
        options.setdefault("data", "fake")
    if key in TORCHVISION_INPUT_SIZE:
        key = f"{key}-fashion-mnist"
    if key not in WORKLOADS:
        raise ValueError(f"workload {name!r} is unknown; known: {sorted(WORKLOADS)} "
                         f"(each also as '<name>{FAKE_SUFFIX}')")
    return WORKLOADS[key](**options)


def portable_workload(spec: str | Workload, options: dict[str, Any],
                      resolved: Workload) -> tuple[str | Workload, dict[str, Any]]:
    """What to send Ray workers for a workload: a built-in's name and options (they rebuild
    it), else the Workload itself (a user's object, or what a registered name built)."""
    if isinstance(spec, str) and spec.removesuffix(FAKE_SUFFIX) in BUILT_IN_WORKLOADS | set(
            TORCHVISION_INPUT_SIZE):
        return spec, options
    return resolved, {}


def in_precision(spec: str | Workload, options: dict[str, Any], resolved: Workload,
                 precision: str | None) -> tuple[str | Workload, dict[str, Any], Workload]:
    """(what to send Ray workers, its options, the resolved Workload) of the workload trained
    in `precision` (`tula_ray.precision`; None: the workload's own): a built-in's option,
    any other Workload's field."""
    if precision is not None:
        resolved = replace(resolved, precision=check_precision(precision))
    spec, options = portable_workload(spec, options, resolved)
    if precision is not None and isinstance(spec, str):
        options = {**options, "precision": precision}
    return spec, options, resolved


def resolve_workload(spec: str | Workload, options: dict[str, Any] | None = None) -> Workload:
    """A Workload from a name + options (as Tune configs carry it) or a Workload itself."""
    if isinstance(spec, Workload):
        if options:
            raise ValueError("workload_options apply to built-in names only; "
                             f"got a Workload {spec.name!r} and options {sorted(options)}")
        return spec
    if isinstance(spec, str):
        return get_workload(spec, **dict(options or {}))
    raise TypeError(f"workload must be a name or a Workload, not {type(spec).__name__}")
