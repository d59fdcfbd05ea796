"""What one worker group of a profiling trial builds once and reuses for every batch it
profiles (`Sweep`), how it profiles one batch (`Sweep.profile`: the phases of
`tula_ray.training.profile_phases`, in order), and the batch's row (`profile_batch`).

It runs under any torch.distributed process group: Ray Train's in the profiling trial
(`trainables.profiling_loop`, which says where this worker sits: `SweepWorker`), or a
plain one (`SweepWorker.of_process_group`). No Ray here (core module).
"""

from __future__ import annotations

import logging
import math
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from tula_ray.distributed import gathered_objects, max_over_ranks
from tula_ray.failures import is_out_of_memory, workload_code
from tula_ray.models.memory import gradient_bytes, over_budget
from tula_ray.precision import set_math_mode
from tula_ray.profile_table import (FAILURE_OOM, MAX_ERROR_CHARS, STATUS_OK, STATUS_OOM,
                                    profile_row)
from tula_ray.space import check_batch_in_dataset
from tula_ray.training.batches import tensor_source, training_batches
from tula_ray.training.data import evaluation_batch, loader_options
from tula_ray.training.epoch_costs import checkpoint_s, evaluation_s
from tula_ray.training.host_allocator import steady_host_allocator
from tula_ray.training.measure import (collective_buffer_bytes, ddp_bucket_bytes,
                                      reset_peak_memory)
from tula_ray.training.phase_agreement import PhaseAgreement
from tula_ray.training.profile_phases import (ProfiledTraining, StrategyRun,
                                              compute_and_synced_steps, first_step,
                                              gradient_noise, memory_step, strategy_batch,
                                              strategy_extra_s, warm_up)
from tula_ray.training.profile_settings import ProfileSettings, warmup_seconds_default
from tula_ray.training.step_timing import (cycle, max_measure_steps, mean_step_s,
                                           measured_step_count, spread as step_spread)
from tula_ray.training.strategy_base import StrategySetup
from tula_ray.workloads import resolve_workload

logger = logging.getLogger(__name__)


def data_parallel(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` on `device`, wrapped in DDP when the process group has more than one rank:
    what Ray Train's `prepare_model` does, for a group started without Ray."""
    model = model.to(device)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None)


@dataclass(frozen=True)
class SweepWorker:
    """Where this process sits in its worker group, as its launcher says: the group's
    size, this worker's rank, device and node (Ray's node ID; a host name without Ray),
    how the launcher wraps a model for data parallelism (None: `data_parallel`), and
    the CPUs it holds (reported with the row)."""

    world_size: int
    rank: int
    device: torch.device
    node: str
    prepare_model: Callable[[nn.Module], nn.Module] | None = None
    cpus_per_worker: float = math.nan

    @classmethod
    def of_process_group(cls, device: torch.device | str = "cpu") -> "SweepWorker":
        """This process in the default torch.distributed group (one process without it)."""
        distributed = dist.is_initialized()
        return cls(dist.get_world_size() if distributed else 1,
                   dist.get_rank() if distributed else 0, torch.device(device),
                   socket.gethostname())

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.prepare_model is not None:
            return self.prepare_model(model)
        return data_parallel(model, self.device)


def nodes_spanned(node: str, process_group: Any = None) -> int:
    """The nodes a worker group spans: its workers' distinct `node`s, gathered over
    `process_group` (every rank calls it, at the same point). Not Ray Train's node rank:
    that numbers node IPs, which the nodes of a test cluster on one machine share."""
    return len(set(gathered_objects(node, process_group)))


class Sweep:
    """What a worker group builds once and reuses for every batch: workload, model, data.
    first_batch: the smallest B it profiles (its trial's `ProfileGrid.first_batch`), where
    it also times the epoch's costs and the training strategy. last_batch: the largest
    (`ProfileGrid.last_batch`), where it times the evaluation pass again (`profile`)."""

    def __init__(self, settings: ProfileSettings, worker: SweepWorker,
                 first_batch: int, last_batch: int | None = None) -> None:
        self.settings, self.worker, self.first_batch = settings, worker, first_batch
        self.last_batch = last_batch
        self.test_set: Any = None  # the workload's test set, once an evaluation loads it
        self.world_size, self.rank, self.device = worker.world_size, worker.rank, worker.device
        self.warmup, self.measure = settings.warmup_steps, settings.measure_steps
        self.budget_s = settings.measure_seconds
        self.warmup_s = (warmup_seconds_default(self.device) if settings.warmup_seconds is None
                         else settings.warmup_seconds)
        if self.warmup < 0 or self.measure < 1 or self.warmup_s < 0:
            raise ValueError(f"warmup_steps={self.warmup}, measure_steps={self.measure}, "
                             f"warmup_seconds={self.warmup_s}; need warmup_steps >= 0, "
                             "measure_steps >= 1 and warmup_seconds >= 0")
        self.workload = resolve_workload(settings.workload, settings.workload_options)
        steady_host_allocator()  # the steps `train` takes, from the first (host_allocator)
        torch.manual_seed(settings.seed)
        self._load_data()
        # Every phase of a batch ends with the workers' agreement (its own gloo group).
        self.agreement = PhaseAgreement(self.device)
        self.num_nodes = nodes_spanned(worker.node, self.agreement.group)
        self.training = self._build_training()
        self.strategy_batch, self.strategy_options = strategy_batch(
            settings.training_strategy, settings.training_options, self.world_size,
            self.first_batch, len(self.dataset))  # type: ignore[arg-type]
        # DDP's gradient buckets, which CUDA's peak counts and the budget took off apart.
        self.bucket_bytes = float(gradient_bytes(self.training.model)) \
            if self.training.distributed else 0.0
        # The profiled model's training so far (every optimizer step of the sweep): how far
        # it had trained when a row's noise was measured.
        self.trained_steps = self.trained_samples = self.global_batch = 0
        self.training.plain.optimizer.register_step_post_hook(self._count_step)

    def _count_step(self, *_: Any) -> None:
        self.trained_steps += 1
        self.trained_samples += self.global_batch

    def _load_data(self) -> None:
        """The training set, placed once (on the GPU when it fits): every batch of the sweep
        gathers from it; and the seconds it took (the row's data_load_s)."""
        started = time.perf_counter()
        with workload_code(self.workload.name, "train_dataset_fn()"):
            self.dataset = self.workload.train_dataset_fn()
            self.source = tensor_source(self.dataset, self.device,
                                        on_device=self.workload.data_on_device)
        self.data_load_s = time.perf_counter() - started

    def _build_training(self) -> ProfiledTraining:
        """The model (DDP-wrapped), optimizer and loss, in the workload's precision, and the
        plain step `train` takes; each of the workload's functions named if it fails."""
        name = self.workload.name
        with workload_code(name, "model_fn()"):
            model = self.workload.model_fn()
        # NCCL's buffers, made by the group's first collective (the communicator is lazy):
        # measured around an all-reduce of DDP's bucket for this model, before DDP's own
        # broadcast (in `wrap`) makes the communicator, for the row's memory check.
        self.nccl_buffer_bytes = collective_buffer_bytes(
            self.device, dist.all_reduce, bucket_bytes=ddp_bucket_bytes(model)) \
            if self.world_size > 1 else None
        model = self.worker.wrap(model)
        model.train()
        with workload_code(name, "optimizer_fn(model.parameters())"):
            optimizer = self.workload.optimizer_fn(model.parameters())
        with workload_code(name, "loss_fn()"):
            loss_fn = self.workload.loss_fn()
        # The workload's precision, as `train` will set it (`tula_ray.precision`).
        self.math_mode = set_math_mode(self.workload.precision)
        # The step `train` takes, plain (its autocast; fp16's loss scaler).
        plain = StrategySetup("plain", optimizer)
        plain.set_precision(self.workload.precision, self.device)
        training = ProfiledTraining(model, plain, loss_fn, self.device, self.agreement,
                                    self.worker.wrap)
        training.attach_noise()  # its per-step work is `train`'s: timed with the steps
        return training

    def batches(self, local_batch: int) -> Iterator:
        """This rank's batches at `local_batch`, forever: the data path `train` takes
        (`self.data_path` says which)."""
        batches = training_batches(
            self.dataset, local_batch, self.device, seed=self.settings.seed,
            num_replicas=self.world_size, rank=self.rank, source=self.source,
            **loader_options(self.workload))
        self.data_path = batches.path
        return cycle(batches)

    def epoch_costs(self, local_batch: int) -> dict[str, float]:
        """The epoch's costs beyond its steps, once per worker group: one evaluation pass
        (when the workload has a test set) at the batch `train` evaluates in after
        training at `local_batch`, and one checkpoint write with its upload to the search's
        storage, each agreed on; the samples of the pass (`eval_samples`) and of the
        workload's own validation split (`validation_samples`, when it has one)."""
        model, plain = self.training.model, self.training.plain
        costs = {"checkpoint_time_s": self.agreement.run("checkpoint", lambda: checkpoint_s(
            model, plain, self.device, rank=self.rank,
            storage_path=self.settings.storage_path))}
        costs.update(self.evaluation_costs(local_batch))
        if self.workload.val_dataset_fn is not None:  # else held out of the training set
            with workload_code(self.workload.name, "len(val_dataset_fn())"):
                costs["validation_samples"] = float(len(self.workload.val_dataset_fn()))
        return costs

    def evaluation_costs(self, local_batch: int) -> dict[str, float]:
        """One evaluation pass (when the workload has a test set) at the batch `train`
        evaluates in after training at `local_batch`, agreed on: `eval_time_s`, and its
        samples (`eval_samples`: the plan prices a run to a target's validation passes
        from it by their samples, `planning.target_costs`)."""
        if self.workload.test_dataset_fn is None:
            return {}
        name, eval_batch = self.workload.name, evaluation_batch(self.workload, local_batch)
        costs: dict[str, float] = {}

        def evaluation() -> float:
            if self.test_set is None:  # loaded once: the pass is timed at two batches
                with workload_code(name, "test_dataset_fn()"):
                    self.test_set = self.workload.test_dataset_fn()
            test_set = self.test_set
            costs["eval_samples"] = float(len(test_set))
            # Its own stage: a model failing here fails in `train`'s evaluation, not in
            # the training steps the row is named after.
            with workload_code(name, f"evaluation at batch {eval_batch} on "
                                     f"N={self.world_size} workers"):
                return evaluation_s(self.training.model, test_set, self.training.loss_fn,
                                    self.device, eval_batch=eval_batch,
                                    num_replicas=self.world_size, rank=self.rank,
                                    autocast=self.training.plain.autocast)
        costs["eval_time_s"] = self.agreement.run("evaluation", evaluation)
        return costs

    def profile(self, global_batch: int) -> dict[str, Any]:
        """One batch's row fields, its phases in order; every phase ends with the workers'
        agreement: a failure on any worker raises on every worker, with its class."""
        world_size, device, training = self.world_size, self.device, self.training
        if global_batch % world_size:
            raise ValueError(f"global_batch={global_batch} is not divisible by num_workers="
                             f"{world_size}; B must be a multiple of N")
        local_batch, self.global_batch = global_batch // world_size, global_batch
        result = self._diagnostics()
        check_batch_in_dataset("global_batch", global_batch, self.workload.name,
                               len(self.dataset))  # type: ignore[arg-type]
        batches = self.batches(local_batch)
        tally = training.tally(local_batch)

        def run_step() -> None:
            tally.step(*next(batches))

        reset_peak_memory(device)
        # 1. Warm-up: the first step (agreed on), memory's step off CUDA, the rest.
        warm = first_step(training, run_step)
        error = self._cpu_memory_step(batches, warm, result)
        if error:
            return {**result, "status": STATUS_OOM, "failure": FAILURE_OOM, "error": error}
        settled, warm_s = warm_up(training, run_step,
                                         min_steps=max(self.warmup - len(warm), 1),
                                         min_seconds=self.warmup_s)
        warm += settled
        # 2-3. Compute-only and synced steps, in alternating blocks.
        compute, step = compute_and_synced_steps(training, run_step, measured_step_count(
            warm_s, self.measure, self.budget_s, max_measure_steps(device)))
        # The training steps' peak, read before the untimed phases below: the noise's
        # flat gradients and the strategy phase's second model are no step of `train`.
        training_peak = float(torch.cuda.max_memory_allocated(device)) \
            if device.type == "cuda" else math.nan
        # 4. The gradient noise at this batch, untimed.
        result.update(self._noise_fields(batches, warm_s))
        if global_batch == self.first_batch:
            result.update(self.epoch_costs(local_batch))
            if self.strategy_batch is not None:
                result["strategy_extra_s"] = self._strategy_extra_s()
            reset_peak_memory(device)  # the strategy's second model is gone: not the next row's
        elif global_batch == self.last_batch and self.workload.eval_batch is None:
            # The pass again at the largest b: its cost per sample moves with b (the CNN's
            # pass took 1.8x as long at B = 2048 as at 32 in train-time's runs, and at
            # N = 2 hardly changed), and the plan interpolates between the two.
            result.update(self.evaluation_costs(local_batch))
        result.update(self._step_fields(global_batch, compute, step, warm, training_peak))
        return result

    def _noise_fields(self, batches: Iterator, warm_s: float) -> dict[str, Any]:
        """4. The gradient noise (`gradient_noise`), as the row's grad_sqr, grad_var and
        noise_steps, and how far the model had trained then (noise_after_steps, _samples)."""
        noise = gradient_noise(self.training, batches, warm_s, self.world_size)
        grad_sqr, grad_var = noise.estimate()
        return {"grad_sqr": grad_sqr, "grad_var": grad_var, "noise_steps": noise.steps,
                "noise_after_steps": self.trained_steps,
                "noise_after_samples": self.trained_samples}

    def _strategy_extra_s(self) -> float:
        """5. What the training strategy adds to a step, at `strategy_batch`."""
        global_batch = self.strategy_batch
        batches = self.batches(global_batch // self.world_size)
        run = StrategyRun(
            self.settings.training_strategy, self.strategy_options, global_batch,
            epochs=int(self.settings.epochs or self.workload.epochs),
            steps_per_epoch=max(1, len(self.dataset) // global_batch),  # type: ignore[arg-type]
            workload=self.workload)
        return strategy_extra_s(self.training, run, batches, min_steps=self.measure,
                                       budget_s=self.budget_s)

    def _diagnostics(self) -> dict[str, Any]:
        """Fields beside the profile's: per-worker compute speed depends on them."""
        return {"torch_threads": torch.get_num_threads(),
                "device": self.device.type, "data_load_s": self.data_load_s,
                "precision": self.workload.precision, **self.math_mode,
                "cpus_per_worker": self.worker.cpus_per_worker,
                "nccl_buffer_bytes": (math.nan if self.nccl_buffer_bytes is None
                                      else self.nccl_buffer_bytes)}

    def _cpu_memory_step(self, batches: Iterator, warm: list[float],
                         result: dict[str, Any]) -> str:
        """Off CUDA (unless measure_memory is False): memory's step, its seconds added to
        `warm`, the largest rank's peak to `result`; the error when that peak is over
        device_memory_bytes, else ""."""
        limit = self.settings.device_memory_bytes
        if self.device.type == "cuda" or not self.settings.measure_memory:
            return ""
        peak, seconds = memory_step(self.training, batches)
        warm.append(seconds)
        result.update(peak_mem_bytes=peak, memory_source="memtracker")
        # MemTracker watches the bare module: no DDP bucket in its peak.
        return "" if limit is None else over_budget(peak, float(limit))

    def _step_fields(self, global_batch: int, compute: list[float], step: list[float],
                     warm: list[float], training_peak: float) -> dict[str, Any]:
        """The row's timing fields, each the slowest rank's; on CUDA its peak too, checked
        against device_memory_bytes (status "oom" when over)."""
        device, limit = self.device, self.settings.device_memory_bytes
        distributed = self.training.distributed
        medians = [mean_step_s(compute), mean_step_s(step), step_spread(step),
                   sum(compute) + (sum(step) if distributed else 0.0), sum(warm)]
        if device.type == "cuda":
            medians.append(training_peak)  # reduced[5]
        reduced = max_over_ranks(medians, device)
        compute_s, step_s, spread, timed_s, warm_s = reduced[:5]
        # Timing noise (~15 % here) can make the compute-only mean exceed the synced
        # one when the collective is cheap; sync cannot be negative, so the whole step
        # is then compute and the row stays consistent: step = compute + sync.
        compute_s = min(compute_s, step_s)
        fields = dict(
            compute_time_s=compute_s, step_time_s=step_s, sync_time_s=step_s - compute_s,
            samples_per_s=global_batch / step_s, step_time_spread=spread,
            warmup_steps=len(warm), measure_steps=len(step), timed_wall_s=timed_s,
            warmup_wall_s=warm_s, data_path=self.data_path,
            status=STATUS_OK, error="")
        if device.type == "cuda":
            fields.update(peak_mem_bytes=reduced[5], memory_source="cuda")
            # The user may declare a device smaller than this GPU. The budget took DDP's
            # buckets, NCCL's buffers and the dataset kept on the GPU off apart: each is
            # counted once (`over_budget`).
            error = "" if limit is None else over_budget(
                reduced[5], float(limit), bucket_bytes=self.bucket_bytes,
                nccl_buffer_bytes=self.nccl_buffer_bytes,
                resident_bytes=0 if self.source is None else self.source.device_bytes)
            if error:
                fields.update(status=STATUS_OOM, failure=FAILURE_OOM, error=error)
        return fields


def profile_batch(sweep: Sweep, global_batch: int, *, launch_s: float = math.nan,
                  round_index: float = math.nan) -> dict[str, Any]:
    """This worker's row for `global_batch` (its search round `round_index`; `launch_s`:
    the launch's wall time): measured, or "oom" (failure "oom") when any worker of the
    group ran out of memory (the phases' agreement raises it on all); any other failure
    is raised, the workload's own as a UserCodeError."""
    world_size = sweep.world_size
    started = time.perf_counter()
    row = profile_row(world_size, global_batch, status=STATUS_OK)
    row["num_nodes"] = sweep.num_nodes  # an "oom" row's too: where it ran out
    try:
        # The workload's own code fails as a UserCodeError (the search's taxonomy).
        with workload_code(sweep.workload.name, f"training at B={global_batch} on "
                                                f"N={world_size} workers"):
            row.update(sweep.profile(global_batch))
    except RuntimeError as exc:  # torch's OOM, a CUDA library's, NCCL's, or a peer's
        if not is_out_of_memory(exc):
            raise
        logger.warning("out of memory at B=%d N=%d: %s", global_batch, world_size, exc)
        row.update(status=STATUS_OOM, failure=FAILURE_OOM,
                   error=f"{type(exc).__name__}: {exc}"[-MAX_ERROR_CHARS:])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    row.update(round=round_index, launch_wall_s=launch_s,
               profile_wall_s=time.perf_counter() - started)
    return row
