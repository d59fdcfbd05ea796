"""What to train: a `Workload` (model, data, loss, optimizer), the built-ins, their data.

  workload             `Workload`, the built-in workloads, `get_workload`/`resolve_workload`;
  datasets             Fashion-MNIST and FakeData, offline;
  fashion_mnist_files  where the demo's data come from (a cache, Debian's archive);
  stage                the built-ins' data fetched and decoded once per node (cluster setup);
  check                a workload's first samples and one step: what it is, before any run.

Core: no Ray. `Workload` is also `tula_ray.Workload`.
"""

from tula_ray.workloads.workload import (EPOCHS_DEFAULT, LR_DEFAULT, FashionCNN, MOMENTUM_DEFAULT,
                                         WEIGHT_DECAY_DEFAULT, WORKLOADS, Workload, get_workload,
                                         in_precision, portable_workload, register_workload,
                                         resolve_workload, sgd)

__all__ = ["EPOCHS_DEFAULT", "FashionCNN", "LR_DEFAULT", "MOMENTUM_DEFAULT", "WEIGHT_DECAY_DEFAULT",
           "WORKLOADS", "Workload", "get_workload", "in_precision", "portable_workload",
           "register_workload",
           "resolve_workload", "sgd"]
