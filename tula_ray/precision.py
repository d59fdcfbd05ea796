"""Numerical precision of training (issue 24, item 4): what a step computes in, set the
same way in the memory probe, the profile, the strategy-cost phase and `train`, so that
the plan's times and memory are those of the training it plans.

  "fp32"  float32 everywhere, TF32 off for matmuls and convolutions (torch leaves it
          on for cuDNN's convolutions and off for matmuls: set here, not left to chance);
  "tf32"  float32 tensors, TF32 math on a GPU that has it (Ampere and later);
  "bf16"  autocast to bfloat16 (forward and loss; the backward follows the forward's
          types), TF32 for what stays float32. No loss scaling is needed: bfloat16 has
          float32's range. On CPU, torch's CPU autocast (the tests here);
  "fp16"  autocast to float16 with loss scaling (torch's GradScaler, its defaults): the
          loss is multiplied before the backward so that small gradients do not flush to
          zero, the gradients are divided back before the optimizer sees them, and a step
          whose gradients overflowed is skipped (the scale then halves). AGS reads its
          gradient norms unscaled and refreshes only on steps that were taken
          (`TulaOptimizer.loss_scale`). For GPUs without bfloat16 (V100, T4).
Shared vocabulary: no Ray, no tula_ray import but `arguments`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, ContextManager

import torch

from tula_ray.arguments import check_choice

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PRECISION_DEFAULT = "fp32"
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
LOSS_SCALED = ("fp16",)  # float16's range is too narrow for small gradients


def check_precision(value: Any) -> str:
    """`value` if it is a precision tula-ray trains in; else an error naming the choices."""
    return check_choice("precision", value, PRECISIONS, hint="what a training step computes in")


def autocast_for(precision: str, device: torch.device | str) -> Callable[[], ContextManager]:
    """A factory of the context a step's forward and loss run in: torch.autocast for a
    reduced precision, else nothing."""
    dtype = AUTOCAST_DTYPES.get(check_precision(precision))
    if dtype is None:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=torch.device(device).type, dtype=dtype)


def grad_scaler_for(precision: str, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A new loss scaler (torch's GradScaler, its defaults) for a precision that needs one,
    else None. One per training run: it carries the scale from step to step (and in the
    checkpoint)."""
    if check_precision(precision) not in LOSS_SCALED:
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def set_math_mode(precision: str) -> dict[str, bool]:
    """Set TF32 for this process as `precision` asks (off for "fp32", on otherwise) and
    return what was set, to be recorded beside the measurements."""
    allow = check_precision(precision) != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    return {"tf32_matmul": allow, "tf32_cudnn": allow}


def profiled_precision_note(precision: str | None, profiled: str | None) -> str | None:
    """The note of a training run in `precision` (None: the plan's own) when the plan's
    steps were profiled in another (`profiled`, its meta's "precision"; None: unrecorded),
    else None: its step times and memory are then that precision's, not this one's."""
    if precision is None or profiled is None or check_precision(precision) == profiled:
        return None
    return (f"precision={precision!r}, but the plan's times were profiled in {profiled!r}: "
            "its step times and memory bound are that precision's; search again with "
            f"precision={precision!r} for a plan of this one")


def check_precision_on_device(precision: str, device: torch.device | str) -> None:
    """Refuse bf16 on a GPU without it (`torch.cuda.is_bf16_supported`, without torch's
    emulation: compute capability 8.0 and later), naming what to train in instead."""
    device = torch.device(device)
    if (check_precision(precision) == "bf16" and device.type == "cuda"
            and not torch.cuda.is_bf16_supported(including_emulation=False)):
        raise ValueError("precision='bf16', but this GPU has no bfloat16 support "
                         "(torch.cuda.is_bf16_supported() is False: before Ampere); "
                         "train in 'fp16' (loss-scaled) or 'fp32'")
