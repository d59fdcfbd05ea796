"""The memory probe's task body, Ray-free (DESIGN step 1), and what `train` holds beyond
the probe's training steps (issue 46, item 2: what the bound must cover).

`checked_and_measured` is what the probe's Ray task (`trainables.memory_probe`) runs on a
worker, and gpu-acceptance's bound check in one process: the workload checked, the
probe's peaks (`measure.probe_peaks`), then two measurements of what `train` adds:
  - the training strategy's optimizer state beyond the workload's optimizer, which the
    probe's steps ran (`strategy_state_bytes`): taken off the memory budget;
  - one evaluation batch of a workload that declares `eval_batch`
    (`evaluation_peak_or_none`). Without eval_batch, evaluation runs at the training's
    local batch b, whose forward without autograd needs less than the training step the
    probe measured at b. A declared eval_batch is evaluated whatever b, so its peak is
    one number, checked once against the budget (`planning.bounds.check_evaluation_fits`)
    rather than a term of eq. 3. While it evaluates, a worker holds the model, the last
    step's gradients (cleared only by the next step) and the optimizer's state.
"""

from __future__ import annotations

import time

import torch

from tula_ray.arguments import check_int
from tula_ray.failures import workload_code
from tula_ray.models import bound_search
from tula_ray.precision import autocast_for
from tula_ray.training.host_allocator import node_memory_bytes
from tula_ray.training.measure import (Example, peak_over, probe_peaks, synthetic_batch,
                                       tiled_batch, train_step)
from tula_ray.workloads import Workload, resolve_workload
from tula_ray.workloads.check import complete, inspect_workload


def checked_and_measured(workload: str | Workload, options: dict | None,
                         local_batches: list[int], device: torch.device | str,
                         strategy=None, strategy_options: dict | None = None) -> dict:
    """DESIGN step 1 in this process, what the probe's Ray task runs on a worker: the
    workload resolved, checked and completed (`workloads.check`: a contradicted
    declaration fails here), then, given `local_batches`, the probe's peaks
    (`probe_peaks`), and what `train` holds beyond them: given a training strategy, the
    optimizer state it keeps beyond the workload's ("strategy_state_bytes"); for a
    workload that declares eval_batch, one evaluation batch ("eval_peak_bytes",
    `evaluation_peak_or_none`). Returns probe_peaks' dict with those, "facts", the
    completed "workload" and "measure_s"."""
    resolved = resolve_workload(workload, options)
    facts = inspect_workload(resolved, device)
    completed = complete(resolved, facts)
    started = time.perf_counter()
    measured: dict = {}
    if local_batches:
        measured = probe_peaks(completed, local_batches, device, example=facts.example)
        if strategy is not None:
            measured["strategy_state_bytes"] = strategy_state_bytes(
                completed, strategy, strategy_options, example=facts.example)
        if completed.eval_batch is not None:
            measured["eval_peak_bytes"] = evaluation_peak_or_none(completed, device,
                                                                  facts.example)
    return {"facts": facts, "workload": completed, **measured,
            "measure_s": time.perf_counter() - started}


def strategy_state_bytes(workload: Workload, strategy, options: dict | None,
                         example: Example | None = None) -> float:
    """Optimizer-state bytes the training strategy's optimizer keeps beyond the workload's
    own (0 when it keeps no more), for `workload`'s model, measured on the CPU once: each
    trains one step on a small batch (`SMALL_STATE_BATCH`, AGS's sub-batch taken from
    it), which materialises its per-parameter state (momentum, Adam's moments, AGS's
    scales and averages, LARS's buffers), and the tensors of its `state_dict` are counted
    (TulaOptimizer's holds its base optimizer's state too).

    Why a difference of state bytes and not the strategy's step inside the probe: the
    probe measures one process at each local batch, while a strategy's setup depends on
    N, B and torch.distributed (AGS-NS's source "local" needs DDP on >= 2 workers; AGS at
    B <= 32 is plain steps). Its optimizer state does not depend on the batch, so the
    bytes it adds over the workload's optimizer (which the probe's steps already hold) are
    one number, taken off the memory budget (`planning.bounds.memory_budget_bytes`).
    The strategy is built as for one process (`one_process_options`) at a B twice its
    reference small batch, where AGS scales (at a B no larger it trains plain steps).
    example: the workload's first samples, tiled into the batch (`tiled_batch`: token ids
    stay ids); without it, random inputs of its sample shape.
    """
    from tula_ray.ags import SMALL_BATCH_DEFAULT
    from tula_ray.models.memory import tensor_bytes
    from tula_ray.training.strategies import build_strategy, get_training_strategy

    strategy, options = get_training_strategy(strategy), dict(options or {})
    batch = 2 * int(options.get("small_batch", SMALL_BATCH_DEFAULT))
    if hasattr(strategy, "one_process_options"):
        options = strategy.one_process_options(1, batch, options)
    inputs, targets = tiled_batch(example, batch) if example is not None else \
        synthetic_batch(workload.sample_shape, workload.num_classes, batch)

    def stepped_state(name, strategy_options: dict) -> int:
        model = workload.model_fn()
        setup = build_strategy(name, model, global_batch=batch, steps_per_epoch=1, epochs=1,
                               options=strategy_options, optimizer_fn=workload.optimizer_fn)
        setup.start_epoch(0)
        setup.train_step(model, workload.loss_fn(), inputs, targets)
        return tensor_bytes(setup.optimizer.state_dict())

    own = stepped_state("lbt", {})  # the workload's optimizer as it is: what the probe ran
    return float(max(stepped_state(strategy, options) - own, 0))


def evaluation_peak_or_none(workload: Workload, device: torch.device | str,
                            example: Example) -> float | None:
    """`evaluation_peak_bytes` at the workload's eval_batch; None when the device ran out
    of memory (`bound_search.peak_or_none`). The workload's own code failing there raises
    a UserCodeError naming the evaluation and its batch. On a CPU, a batch whose inputs
    alone exceed the node's RAM is not tried (None): the OS would end the worker instead
    of raising."""
    cuda = torch.device(device).type == "cuda"
    inputs_bytes = workload.eval_batch * workload.input_bytes_per_sample
    if not cuda and inputs_bytes > node_memory_bytes():
        return None
    release = torch.cuda.empty_cache if cuda else None

    def measured(eval_batch: int) -> float:
        with workload_code(workload.name, f"memory probe's evaluation at eval_batch "
                                          f"{eval_batch}"):
            return float(evaluation_peak_bytes(workload, eval_batch, device, example))

    return bound_search.peak_or_none(measured, workload.eval_batch,
                                     after_out_of_memory=release)


def evaluation_peak_bytes(workload: Workload, eval_batch: int, device: torch.device | str,
                          example: Example) -> int:
    """Peak bytes of one worker evaluating a batch of `eval_batch` samples (`example`'s,
    tiled) after one training step (its gradients and optimizer state held, as after an
    epoch's last step), in the workload's precision (`measure.peak_over`, as the probe's
    peaks). Raises torch.OutOfMemoryError when a GPU runs out."""
    check_int("eval_batch", eval_batch, minimum=1)
    device = torch.device(device)
    autocast = autocast_for(workload.precision, device)
    model = workload.model_fn().to(device).train()
    optimizer, loss_fn = workload.optimizer_fn(model.parameters()), workload.loss_fn()

    def one_training_step() -> None:  # of 2 samples: batch norm needs more than one
        train_step(model, optimizer, loss_fn, *tiled_batch(example, 2, device),
                   autocast=autocast)

    @torch.no_grad()
    def evaluation_batch() -> None:
        inputs, _ = tiled_batch(example, eval_batch, device)
        model.eval()
        with autocast():
            model(inputs)
        model.train()

    one_training_step()  # its gradients and state stay: the peak counts them, not its own
    return peak_over([evaluation_batch], device, model, optimizer)
