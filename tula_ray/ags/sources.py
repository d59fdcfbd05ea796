"""Where AGS's small-batch gradient comes from (paper Algorithm 1 lines 13-14; DESIGN "AGS").

  "sub-batch": `backward_with_refresh` runs an extra forward/backward on the first
      `small_batch` samples of the local batch, outside DDP's all-reduce, on the steps
      where a refresh is due (the paper's way);
  "local": under DDP each worker's own gradient, BEFORE the all-reduce, is a
      small-batch gradient of b = B/N. `register_local_gradient_hook` installs a DDP
      communication hook that reads each gradient bucket before doing exactly what
      DDP's default does (torch's `allreduce_hook`), so this source costs no extra
      backward and no change to the all-reduce.

No Ray here (core module).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from tula_ray.ags.optimizer import TulaOptimizer
from tula_ray.distributed import world_size


def is_ddp(model: nn.Module) -> bool:
    return isinstance(model, nn.parallel.DistributedDataParallel)


def _take_grads(params: list[nn.Parameter]) -> list[torch.Tensor | None]:
    """Detach the current gradients from the parameters (and leave p.grad empty)."""
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    return grads


def backward_with_refresh(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                          inputs: torch.Tensor, targets: torch.Tensor, *,
                          autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                          scaler: torch.amp.GradScaler | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of one step, taking a sub-batch gradient when a refresh is due.

    Replaces `loss_fn(model(inputs), targets).backward()` after `zero_grad()`;
    returns (loss, outputs) of the full local batch. Any other optimizer, source
    "local" (its hook reads the gradients during this backward), or a step without a
    refresh, is exactly that plain backward. autocast: the context each forward and loss
    run in (bf16 or fp16 autocast; the gradients AGS reads are float32 either way: the
    parameters are). scaler: fp16's loss scaler; both backwards then run on the scaled
    loss. The sub-batch gradient is handed to the optimizer (`observe_small_gradients`),
    which refreshes its scales in `step()`, on the unscaled gradients of a step taken.
    """
    refresh = (isinstance(optimizer, TulaOptimizer) and optimizer.source == "sub-batch"
               and optimizer.refresh_due)
    if isinstance(optimizer, TulaOptimizer) and optimizer.source == "local" \
            and not optimizer.local_hook_registered:
        raise ValueError("source='local' takes g_small from each DDP worker's own gradient: "
                         "call register_local_gradient_hook(model, optimizer) on the "
                         "DistributedDataParallel model first (>= 2 workers)")
    def scaled(loss: torch.Tensor) -> torch.Tensor:
        return loss if scaler is None else scaler.scale(loss)

    if not refresh:
        with autocast():
            outputs = model(inputs)
            loss = loss_fn(outputs, targets)
        scaled(loss).backward()
        return loss, outputs
    if optimizer.small_batch >= len(inputs):
        raise ValueError(f"small_batch={optimizer.small_batch} must be smaller than the local "
                         f"batch ({len(inputs)} samples) to sample a sub-batch from it")
    params = optimizer.parameters()
    # Lines 13-14: a sub-batch of the (shuffled) local batch, kept out of DDP's all-reduce,
    # in training mode (eval-mode BatchNorm would change the gradient) but with every
    # buffer (BatchNorm running statistics) restored afterwards: Algorithm 1 computes a
    # gradient here, it does not train the statistics on an extra batch.
    buffers = [b.detach().clone() for b in model.buffers()]
    with model.no_sync() if is_ddp(model) else contextlib.nullcontext():
        with autocast():
            small_loss = loss_fn(model(inputs[: optimizer.small_batch]),
                                 targets[: optimizer.small_batch])
        scaled(small_loss).backward()
    with torch.no_grad():
        for buffer, saved in zip(model.buffers(), buffers):
            buffer.copy_(saved)
    small = _take_grads(params)
    optimizer.observe_small_gradients(
        [p for p, g in zip(params, small) if g is not None], [g for g in small if g is not None])
    with autocast():
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
    scaled(loss).backward()
    return loss, outputs


class LocalGradientHookState:
    """State of the "local" source's DDP comm hook: the optimizer it feeds and the group."""

    def __init__(self, optimizer: TulaOptimizer, process_group: Any = None) -> None:
        self.optimizer = optimizer
        self.process_group = process_group


def local_gradient_hook(state, bucket):  # no annotations: DDP checks them against real
    # classes, and this module's are strings (state: LocalGradientHookState, bucket:
    # dist.GradBucket, returns torch.futures.Future[torch.Tensor])
    """DDP comm hook: hand this worker's gradients (b = B/N) to AGS when it wants them,
    then all-reduce the bucket as DDP's default does (torch's `allreduce_hook`)."""
    optimizer = state.optimizer
    if optimizer.refresh_due:
        optimizer.observe_small_gradients(bucket.parameters(), bucket.gradients())
    return allreduce_hook(state.process_group, bucket)


def register_local_gradient_hook(model: nn.Module, optimizer: TulaOptimizer) -> None:
    """Source "local": register `local_gradient_hook` on the DDP `model` (before its first
    backward; DDP takes one comm hook per model)."""
    if optimizer.source != "local":
        raise ValueError(f"the local-gradient hook serves source='local'; this optimizer's "
                         f"source is {optimizer.source!r}")
    if not is_ddp(model) or world_size(optimizer.process_group) < 2:
        raise ValueError("source='local' takes g_small from each DDP worker's own gradient: it "
                         "needs a DistributedDataParallel model on >= 2 workers; "
                         "use source='sub-batch' here")
    model.register_comm_hook(LocalGradientHookState(optimizer, optimizer.process_group),
                             local_gradient_hook)
    optimizer.local_hook_registered = True
