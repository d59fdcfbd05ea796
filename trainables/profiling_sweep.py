"""What one worker group of the profiling loop (`trainables.profiling_loop`) builds once
and reuses for every batch it profiles, and how it profiles one batch (`Sweep.profile`):
the phases, the data path and the timing that the loop's docstring describes.
"""

from __future__ import annotations

import contextlib
import math
import socket
import time
from typing import Any, Callable, Iterator

import ray.train
import ray.train.torch
import torch

from trainables.strategy_cost import measure_strategy_extra_s, strategy_batch
from tula_ray.distributed import gathered_objects, max_over_ranks, sum_over_ranks
from tula_ray.failures import workload_code
from tula_ray.models.memory import gradient_bytes, over_budget
from tula_ray.precision import set_math_mode
from tula_ray.profile_table import FAILURE_OOM, STATUS_OK, STATUS_OOM
from tula_ray.space import check_batch_in_dataset
from tula_ray.training.batches import tensor_source, training_batches
from tula_ray.training.data import evaluation_batch, loader_options
from tula_ray.training.epoch_costs import checkpoint_s, evaluation_s
from tula_ray.training.epochs import EpochTally
from tula_ray.training.gradient_noise import measure_gradient_noise
from tula_ray.training.measure import (collective_buffer_bytes, memtracker_peak_bytes,
                                       reset_peak_memory, train_step)
from tula_ray.training.phase_agreement import PeerOutOfMemoryError, PhaseAgreement
from tula_ray.training.step_timing import (ALTERNATING_BLOCKS, cycle, max_measure_steps,
                                           mean_step_s, measured_step_count,
                                           spread as step_spread, time_block, warm_up)
from tula_ray.training.strategy_base import StrategySetup
from tula_ray.workloads import resolve_workload

WARMUP_STEPS_DEFAULT = 3
WARMUP_SECONDS_GPU = 0.5  # and at least this long on a GPU (`warmup_seconds_default`)
# At least this many timed steps per phase: only steps longer than MEASURE_SECONDS / 3
# run this few (a CPU's largest batches: on the demo a second each, 1-2 % apart); 5
# cost its profiling ~4 s of 66 (`python -m benchmarks profiling-wall`).
MEASURE_STEPS_DEFAULT = 3
# ... and more while a phase takes less than this: cheap for short steps, where the
# mean of a few steps is noisiest relative to the step (fixed costs, scheduler jitter).
MEASURE_SECONDS_DEFAULT = 1.0
SEED_DEFAULT = 0
# The gradient-noise pairs per batch (untimed): at least this many, more while they fit in
# NOISE_SECONDS; each costs about one step.
NOISE_MIN_STEPS = 3
NOISE_SECONDS = 0.5


__all__ = ["PeerOutOfMemoryError", "Sweep", "agree_first_step_fits"]


def agree_first_step_fits(step: Callable[[], list[float]], device: torch.device,
                          no_collective: contextlib.AbstractContextManager,
                          agreement: PhaseAgreement | None = None) -> list[float]:
    """Run `step` (one training step, inside `no_collective`: DDP's no_sync) on every
    worker, then agree over all workers whether it succeeded (`agreement`'s, or a new
    one's). Returns its timing; raises torch.OutOfMemoryError on EVERY worker when any
    one ran out, so that all of them mark the batch "oom" together instead of some
    waiting in a collective (any other failure: every worker raises its class)."""
    agreement = agreement or PhaseAgreement(device)
    return agreement.run("first step", step, inside=no_collective)


class Sweep:
    """What a worker group builds once and reuses for every batch: workload, model, data.
    first_batch: the smallest B it profiles (its trial's `ProfileGrid.first_batch`), where
    it also times the epoch's costs and the training strategy."""

    def __init__(self, config: dict[str, Any], world_size: int, first_batch: int) -> None:
        self.config, self.world_size, self.first_batch = config, world_size, first_batch
        self.rank = ray.train.get_context().get_world_rank()
        self.warmup = int(config.get("warmup_steps", WARMUP_STEPS_DEFAULT))
        self.measure = int(config.get("measure_steps", MEASURE_STEPS_DEFAULT))
        self.budget_s = float(config.get("measure_seconds", MEASURE_SECONDS_DEFAULT))
        self.device = ray.train.torch.get_device()
        self.warmup_s = float(config.get("warmup_seconds", warmup_seconds_default(self.device)))
        if self.warmup < 0 or self.measure < 1 or self.warmup_s < 0:
            raise ValueError(f"warmup_steps={self.warmup}, measure_steps={self.measure}, "
                             f"warmup_seconds={self.warmup_s}; need warmup_steps >= 0, "
                             "measure_steps >= 1 and warmup_seconds >= 0")
        self.workload = resolve_workload(config["workload"], config.get("workload_options"))
        self.seed = int(config.get("seed", SEED_DEFAULT))
        torch.manual_seed(self.seed)
        self._load_data()
        # NCCL's buffers, made by the group's first collective (the communicator is
        # lazy): measured here, before the model, for the row's memory check.
        self.nccl_buffer_bytes = collective_buffer_bytes(
            self.device, lambda: sum_over_ranks([0.0], self.device)) if world_size > 1 else None
        # Every phase of a batch ends with the workers' agreement (its own gloo group).
        self.agreement = PhaseAgreement(self.device)
        self.num_nodes = nodes_spanned(self.agreement.group)
        self._build_training()
        self.strategy_batch, self.strategy_options = strategy_batch(
            config, world_size, self.first_batch, len(self.dataset))  # type: ignore[arg-type]
        self.distributed = isinstance(self.model, torch.nn.parallel.DistributedDataParallel)
        # With buffers (BatchNorm), DDP broadcasts them in the forward after a synced step.
        self.transition = int(self.distributed and any(True for _ in self.model.buffers()))
        # DDP's gradient buckets, which CUDA's peak counts and the budget took off apart.
        self.bucket_bytes = float(gradient_bytes(self.model)) if self.distributed else 0.0

    def _load_data(self) -> None:
        """The training set, placed once (on the GPU when it fits): every batch of the sweep
        gathers from it; and the seconds it took (the row's data_load_s)."""
        started = time.perf_counter()
        with workload_code(self.workload.name, "train_dataset_fn()"):
            self.dataset = self.workload.train_dataset_fn()
            self.source = tensor_source(self.dataset, self.device,
                                        on_device=self.workload.data_on_device)
        self.data_load_s = time.perf_counter() - started

    def _build_training(self) -> None:
        """The model (DDP-wrapped), optimizer and loss, in the workload's precision, and the
        plain step `train` takes; each of the workload's functions named if it fails."""
        name = self.workload.name
        with workload_code(name, "model_fn()"):
            model = self.workload.model_fn()
        self.model = ray.train.torch.prepare_model(model)
        self.model.train()
        with workload_code(name, "optimizer_fn(model.parameters())"):
            self.optimizer = self.workload.optimizer_fn(self.model.parameters())
        with workload_code(name, "loss_fn()"):
            self.loss_fn = self.workload.loss_fn()
        # The workload's precision, as `train` will set it (`tula_ray.precision`).
        self.math_mode = set_math_mode(self.workload.precision)
        # The step `train` takes, plain (its autocast; fp16's loss scaler).
        self.plain = StrategySetup("plain", self.optimizer)
        self.plain.set_precision(self.workload.precision, self.device)
        self.autocast = self.plain.autocast

    def batches(self, local_batch: int) -> Iterator:
        """This rank's batches at `local_batch`, forever: the data path `train` takes
        (`self.data_path` says which)."""
        batches = training_batches(
            self.dataset, local_batch, self.device, seed=self.seed, num_replicas=self.world_size,
            rank=self.rank, source=self.source, **loader_options(self.workload))
        self.data_path = batches.path
        return cycle(batches)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self.model.no_sync() if self.distributed else contextlib.nullcontext()

    def _cpu_peak(self, batches: Iterator) -> tuple[float, float]:
        """One untimed step of this worker's own model under MemTracker: its peak bytes
        and the step's seconds (this worker's: the caller agrees, then reduces). The
        wrapped module trains
        alone (no DDP hooks, no collective), on a real batch. The batch is fetched before
        the tracker and registered with it: a fetch inside would count the whole dataset's
        storage, which the batch's samples view."""
        module = getattr(self.model, "module", self.model)
        started = time.perf_counter()
        inputs, targets = next(batches)
        peak = memtracker_peak_bytes(
            [lambda: train_step(module, self.optimizer, self.loss_fn, inputs, targets,
                                autocast=self.autocast)],
            module, self.optimizer, inputs, targets)
        return float(peak), time.perf_counter() - started

    def epoch_costs(self, local_batch: int) -> dict[str, float]:
        """The epoch's costs beyond its steps, once per worker group: one evaluation pass
        (when the workload has a test set) at the batch `train` evaluates in after
        training at `local_batch`, and one checkpoint write, each agreed on."""
        costs = {"checkpoint_time_s": self.agreement.run("checkpoint", lambda: checkpoint_s(
            self.model, self.plain, self.device, rank=self.rank))}
        if self.workload.test_dataset_fn is not None:
            name, eval_batch = self.workload.name, evaluation_batch(self.workload, local_batch)

            def evaluation() -> float:
                with workload_code(name, "test_dataset_fn()"):
                    test_set = self.workload.test_dataset_fn()
                # Its own stage: a model failing here fails in `train`'s evaluation, not
                # in the training steps the row is named after.
                with workload_code(name, f"evaluation at batch {eval_batch} on "
                                         f"N={self.world_size} workers"):
                    return evaluation_s(self.model, test_set, self.loss_fn, self.device,
                                        eval_batch=eval_batch, num_replicas=self.world_size,
                                        rank=self.rank, autocast=self.autocast)
            costs["eval_time_s"] = self.agreement.run("evaluation", evaluation)
        return costs

    def profile(self, global_batch: int) -> dict[str, Any]:
        """One batch's row fields; every phase ends with the workers' agreement
        (`self.agreement`): a failure on any worker raises on every worker, with its class."""
        world_size, device = self.world_size, self.device
        if global_batch % world_size:
            raise ValueError(f"global_batch={global_batch} is not divisible by num_workers="
                             f"{world_size}; B must be a multiple of N")
        local_batch = global_batch // world_size
        result = self._diagnostics()
        check_batch_in_dataset("global_batch", global_batch, self.workload.name,
                               len(self.dataset))  # type: ignore[arg-type]
        batches = self.batches(local_batch)
        tally = EpochTally(self.model, self.plain, self.loss_fn, device)

        def run_step() -> None:
            tally.step(*next(batches))

        reset_peak_memory(device)
        # 1. Warm-up. The first step, where memory peaks, runs without a collective and
        # the workers agree on whether it fitted: a worker out of memory inside DDP's
        # all-reduce would leave its peers waiting in it until the process-group timeout.
        warm = agree_first_step_fits(lambda: time_block(1, run_step, device), device,
                                     self.no_sync(), self.agreement)
        error = self._cpu_memory_step(batches, warm, result)
        if error:
            return {**result, "status": STATUS_OOM, "failure": FAILURE_OOM, "error": error}
        warm_s = self._settle(run_step, warm)
        # 2-3. Compute-only and synced steps, in alternating blocks.
        compute, step = self._timed_steps(run_step, warm_s)
        # The training steps' peak, read before the untimed phases below: the noise's
        # flat gradients and the strategy phase's second model are no step of `train`.
        training_peak = float(torch.cuda.max_memory_allocated(device)) \
            if device.type == "cuda" else math.nan
        # 4. The gradient noise at this batch, untimed.
        result.update(self._noise_fields(batches, warm_s))
        if global_batch == self.first_batch:
            result.update(self.epoch_costs(local_batch))
            if self.strategy_batch is not None:  # its phases agree in `strategy_cost`
                result["strategy_extra_s"] = measure_strategy_extra_s(self)
            reset_peak_memory(device)  # the strategy's second model is gone: not the next row's
        result.update(self._step_fields(global_batch, compute, step, warm, training_peak))
        return result

    def _diagnostics(self) -> dict[str, Any]:
        """Fields beside the profile's: per-worker compute speed depends on them."""
        return {"torch_threads": torch.get_num_threads(),
                "device": self.device.type, "data_load_s": self.data_load_s,
                "precision": self.workload.precision, **self.math_mode,
                "cpus_per_worker": self.config.get("cpus_per_worker", math.nan),
                "nccl_buffer_bytes": (math.nan if self.nccl_buffer_bytes is None
                                      else self.nccl_buffer_bytes)}

    def _cpu_memory_step(self, batches: Iterator, warm: list[float],
                         result: dict[str, Any]) -> str:
        """Off CUDA (unless measure_memory is False): one step under MemTracker
        (`_cpu_peak`), its seconds added to `warm`, the largest rank's peak to `result`;
        the error when that peak is over device_memory_bytes, else ""."""
        device, limit = self.device, self.config.get("device_memory_bytes")
        if device.type == "cuda" or not self.config.get("measure_memory", True):
            return ""
        peak, seconds = self.agreement.run("memory step", lambda: self._cpu_peak(batches))
        (peak,) = max_over_ranks([peak], device)
        warm.append(seconds)
        result.update(peak_mem_bytes=peak, memory_source="memtracker")
        # MemTracker watches the bare module: no DDP bucket in its peak.
        return "" if limit is None else over_budget(peak, float(limit))

    def _settle(self, run_step: Callable[[], None], warm: list[float]) -> float:
        """The rest of the warm-up, its steps' seconds added to `warm`: `no_sync` steps until
        warmup_steps ran and warmup_seconds passed, then DDP's first synced steps. Returns
        the last settled step's seconds, the slowest rank's: what the timed steps count on."""
        agree, device = self.agreement.run, self.device
        # No collective under no_sync: each worker may warm up for its own count of steps.
        settled = agree("warm-up", lambda: warm_up(
            run_step, device, min_steps=max(self.warmup - len(warm), 1),
            min_seconds=self.warmup_s), inside=self.no_sync())
        warm += settled
        if self.distributed:
            # DDP's first synced step, and the next, whose forward rebuilds the buckets
            # with a broadcast (once per model, even under no_sync): inside this phase, no
            # compute block below holds a collective.
            warm += agree("first synced steps", lambda: time_block(2, run_step, device))
        # The step count comes from an untracked step (MemTracker slows the one it watches).
        (warm_s,) = max_over_ranks([settled[-1]], device)
        return warm_s

    def _timed_steps(self, run_step: Callable[[], None], warm_s: float
                     ) -> tuple[list[float], list[float]]:
        """Phases 2-3: (compute, synced) step seconds, compute-only steps (`no_sync`) and
        synced ones in alternating blocks, as many as fit `measure_seconds` after a
        `warm_s` step; without DDP one list, the steps being the same."""
        agree, device = self.agreement.run, self.device
        steps = measured_step_count(warm_s, self.measure, self.budget_s,
                                    max_measure_steps(device))
        blocks = min(ALTERNATING_BLOCKS, steps) if self.distributed else 1
        per_block = math.ceil(steps / blocks)
        compute: list[float] = []
        step: list[float] = []
        for _ in range(blocks):
            compute += agree("compute steps", lambda: time_block(
                per_block, run_step, device, transition=self.transition), inside=self.no_sync())
            if self.distributed:
                step += agree("synced steps", lambda: time_block(
                    per_block, run_step, device, transition=self.transition))
        return compute, (step if self.distributed else compute)

    def _noise_fields(self, batches: Iterator, warm_s: float) -> dict[str, Any]:
        """Phase 4, untimed: the gradient noise at this batch from pairs of a b- and a
        B-sample gradient of the same weights (the same count on every worker: it
        all-reduces), as the row's grad_sqr, grad_var and noise_steps."""
        device = self.device
        noise = self.agreement.run("gradient noise", lambda: measure_gradient_noise(
            self.model, self.plain, self.loss_fn, batches,
            measured_step_count(warm_s, NOISE_MIN_STEPS, NOISE_SECONDS,
                                max_measure_steps(device)),
            world_size=self.world_size if self.distributed else 1, no_sync=self.no_sync))
        grad_sqr, grad_var = noise.estimate()
        return {"grad_sqr": grad_sqr, "grad_var": grad_var, "noise_steps": noise.steps}

    def _step_fields(self, global_batch: int, compute: list[float], step: list[float],
                     warm: list[float], training_peak: float) -> dict[str, Any]:
        """The row's timing fields, each the slowest rank's; on CUDA its peak too, checked
        against device_memory_bytes (status "oom" when over)."""
        device, limit = self.device, self.config.get("device_memory_bytes")
        medians = [mean_step_s(compute), mean_step_s(step), step_spread(step),
                   sum(compute) + (sum(step) if self.distributed else 0.0), sum(warm)]
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
            # buckets and NCCL's buffers off apart: each is counted once (`over_budget`).
            error = "" if limit is None else over_budget(
                reduced[5], float(limit), bucket_bytes=self.bucket_bytes,
                nccl_buffer_bytes=self.nccl_buffer_bytes)
            if error:
                fields.update(status=STATUS_OOM, failure=FAILURE_OOM, error=error)
        return fields


def nodes_spanned(process_group: Any = None) -> int:
    """The nodes this worker group spans: its workers' distinct node IDs, gathered over
    `process_group` (every rank calls it, at the same point). Not Ray Train's node rank:
    that numbers node IPs, which the nodes of a test cluster on one machine share. Outside
    Ray (torch.distributed.run, or a test standing in for Ray Train) a node is a host."""
    node = (ray.get_runtime_context().get_node_id() if ray.is_initialized()
            else socket.gethostname())
    return len(set(gathered_objects(node, process_group)))


def warmup_seconds_default(device: torch.device) -> float:
    """Warm-up time per batch: a GPU's clocks and cuDNN's autotuning need a fraction of a
    second; on CPU the few warm-up steps are enough."""
    return WARMUP_SECONDS_GPU if device.type == "cuda" else 0.0
