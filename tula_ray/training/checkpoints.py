"""Checkpoints of a training run: what `checkpoint_state` saves (model, the strategy's
optimizer and scheduler, the epoch) lets `restore_state` continue the run exactly as if it had
not stopped. No Ray here (core module); Ray Train's checkpoints carry these states.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tula_ray.distributed import unwrapped
from tula_ray.training.strategy_base import StrategySetup, base_optimizer

CHECKPOINT_KEYS = {"strategy", "epoch", "model", "optimizer", "scheduler", "comm_iter",
                   "loss_scaler", "target", "noise", "adaptive"}
# Keys a checkpoint written before fp16 training (or training to a target, or the online
# noise scale, or an adaptive batch) lacks: it loads as one without a scaler (or a target;
# the noise scale's averages start afresh; a fixed batch).
LATER_KEYS = {"loss_scaler", "target", "noise", "adaptive"}


def checkpoint_state(model: nn.Module, setup: StrategySetup, epoch: int,
                     target: dict[str, Any] | None = None,
                     noise: dict[str, Any] | None = None,
                     adaptive: dict[str, Any] | None = None) -> dict[str, Any]:
    """A snapshot after `epoch` (torch.save-able, every tensor copied to the CPU): the model
    unwrapped from DDP, the optimizer (AGS state included), the scheduler and PoLo's hook
    counter, fp16's loss scaler (its scale and growth count), and a run to a target's
    `TargetTracker.state_dict` (its counts, clock and evaluations), and the online noise
    scale's `OnlineNoise.state_dict` (its averages: a resumed run continues them), and an
    adaptive batch's `BatchAdapter.state_dict` (its schedule). Copies go to the CPU,
    not next to the live tensors: a snapshot on the GPU would double the model's and
    optimizer's memory on the device."""
    state = {"strategy": setup.name, "epoch": epoch, "model": unwrapped(model).state_dict(),
             "optimizer": setup.optimizer.state_dict(),
             "scheduler": None if setup.scheduler is None else setup.scheduler.state_dict(),
             "comm_iter": None if setup.comm_state is None else setup.comm_state.iter,
             "loss_scaler": None if setup.scaler is None else setup.scaler.state_dict(),
             "target": target, "noise": noise, "adaptive": adaptive}
    return cpu_copy(state)  # state_dicts are views of live tensors that training mutates


def cpu_copy(value: Any) -> Any:
    """`value` with every tensor in it copied to the CPU (dicts, lists, tuples walked)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(item) for item in value)
    return value


def restore_state(state: dict[str, Any], model: nn.Module, setup: StrategySetup) -> int:
    """Load a `checkpoint_state` snapshot into a freshly built model and setup.

    Returns the next epoch to run. Raises ValueError if the snapshot is not one or
    belongs to another strategy.
    """
    if not isinstance(state, dict) or not CHECKPOINT_KEYS - LATER_KEYS <= set(state) \
            or not set(state) <= CHECKPOINT_KEYS:
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a training checkpoint: expected keys {sorted(CHECKPOINT_KEYS)}, "
                         f"got {got}")
    if state["strategy"] != setup.name:
        raise ValueError(f"checkpoint of strategy {state['strategy']!r} cannot resume a "
                         f"{setup.name!r} run; build the setup with {state['strategy']!r}")
    if (state["scheduler"] is None) != (setup.scheduler is None):
        raise ValueError("checkpoint and setup disagree on having an LR scheduler: build the "
                         "setup with the options and epochs of the checkpointed run")
    unwrapped(model).load_state_dict(state["model"])
    setup.optimizer.load_state_dict(state["optimizer"])
    # torch's load_state_dict replaces the inner optimizer's param_groups list, and
    # PostLocalSGDOptimizer does not re-share it (TulaOptimizer does): share it here.
    setup.optimizer.param_groups = base_optimizer(setup.optimizer).param_groups
    if setup.scheduler is not None:
        setup.scheduler.load_state_dict(state["scheduler"])
    if setup.comm_state is not None and state["comm_iter"] is not None:
        setup.comm_state.iter = state["comm_iter"]  # else the hook would all-reduce again
    if setup.scaler is not None and state.get("loss_scaler"):
        setup.scaler.load_state_dict(state["loss_scaler"])  # a resumed fp16 run keeps its scale
    return int(state["epoch"]) + 1
