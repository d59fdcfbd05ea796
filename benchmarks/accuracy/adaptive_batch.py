"""python -m benchmarks adaptive-batch (issue 44, item 4): `tula_ray.train(plan,
batch="adaptive")` against every fixed batch, the plan's static time-to-accuracy choice and
B = M0, in time to an early and a late validation accuracy.

Everything the comparison rests on (data, targets, seeds, arms, budgets, bootstrap, goals,
the GPU projection) is `benchmarks.accuracy.adaptive_batch_protocol`, fixed before any run;
this module only carries it out. Per workload, in one Ray session: the plan (a search at
N = 2 of the protocol's data, saved; --quick: synthetic profiles, no search), the fixed-B
runs on the selection seeds, then the scored arms on the scoring seeds. Each run is one
`tula_ray.train` to the late target and is appended to results/adaptive_batch.runs.jsonl
as it ends; a rerun skips what the log records (resumable across sessions). No run starts
once the recorded runs' wall passes the protocol's limit; the report says what is missing.
While `train` takes no `batch=` the adaptive arm is left out, and the report says so.

--quick: the protocol's QUICK (512 images, two batches, one seed, low targets), written to
adaptive_batch_quick.* (git-ignored): a smoke test of the runner, not a measurement.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.accuracy.adaptive_batch_protocol import (
    GPU_RESULTS_GLOB, PROTOCOL, QUICK, SPLIT_SHA256, STRATEGY, WORLD_SIZE,
    Protocol, WorkloadProtocol, gpu_step_seconds, protocol_record, split_digest, split_indices)
from benchmarks.accuracy.adaptive_batch_plan import (explained_switches, fixed_batches,
                                                     planned_arms)
from benchmarks.accuracy.adaptive_batch_report import report
from benchmarks.accuracy.adaptive_batch_runs import ADAPTIVE, arm_runs
from benchmarks.common import RESULTS_DIR, Benchmark, read_runs, rotated_schedule

NAME = "adaptive_batch"
ADAPTIVE_MISSING = "adaptive arm: train has no batch= yet"
__all__ = ["NAME", "report", "run"]


# --------------------------------------------------------------------------- data, plan

def split_images(workload: WorkloadProtocol, part: str):
    """The protocol's "train" or "val" images of Fashion-MNIST's training set."""
    from torch.utils.data import TensorDataset

    from tula_ray.workloads.datasets import fashion_mnist

    images, labels = fashion_mnist(train=True).tensors
    keep = split_indices(workload)[0 if part == "train" else 1]
    return TensorDataset(images[keep], labels[keep])


def protocol_workload(workload: WorkloadProtocol):
    """The built-in workload on the protocol's split: its training images, its own
    validation split (`val_dataset_fn`), Fashion-MNIST's test set for the final score."""
    from tula_ray.workloads import get_workload

    return dataclasses.replace(
        get_workload(workload.name), train_size=workload.train_images,
        train_dataset_fn=functools.partial(split_images, workload, "train"),
        val_dataset_fn=functools.partial(split_images, workload, "val"))


def with_batch(plan, batch: int, num_workers: int = WORLD_SIZE):
    """The plan with (num_workers, batch) as its fixed choice: how a fixed-B arm makes
    `train` train that B (train trains a plan's choice). The plan's tables are left as
    searched."""
    return dataclasses.replace(plan, choice=dataclasses.replace(
        plan.choice, num_workers=num_workers, global_batch=batch, adaptive=False))


def make_plan(workload: WorkloadProtocol, quick: bool, path: Path):
    """The workload's plan at N = WORLD_SIZE, objective time_to_accuracy: searched once and
    saved (a resumed run reads it back); --quick: synthetic profiles, no search."""
    from tula_ray.planning.plan import Plan

    if path.exists() and not quick:
        return Plan.from_json(path)
    if quick:
        from tula_ray.planning.context import PlanContext
        from tula_ray.planning.plan import build_plan
        from tula_ray.planning.synthetic import example_params, synthetic_profiles
        from tula_ray.space import SearchSpace

        space = SearchSpace((WORLD_SIZE,), (workload.min_batch, workload.max_batch))
        profiles = synthetic_profiles(space.candidates(), example_params()).assign(
            grad_sqr=1.0, grad_var=20.0, noise_steps=3)
        context = PlanContext(epochs=1, dataset_size=workload.train_images,
                              objective="time_to_accuracy", workload=workload.name)
        plan = build_plan(space, profiles, context, search_strategy="full")
    else:
        import tula_ray

        plan = tula_ray.search(protocol_workload(workload), cluster_sizes=(WORLD_SIZE,),
                               min_batch=workload.min_batch, max_batch=workload.max_batch,
                               objective="time_to_accuracy", training_strategy=STRATEGY)
    plan.to_json(path)
    return plan


# --------------------------------------------------------------------------- the runs

def adaptive_support(train_fn: Callable) -> str:
    """"ok" when `train_fn` takes `batch=` (the adaptive arm can run), else why not."""
    return "ok" if "batch" in inspect.signature(train_fn).parameters else ADAPTIVE_MISSING


def run_key(spec: dict[str, Any]) -> tuple:
    return spec["workload"], spec["batch"], spec["seed"], spec["version"]


def selection_specs(workload: WorkloadProtocol, protocol: Protocol,
                    batches: list[int]) -> list[dict[str, Any]]:
    """Every fixed B on every selection seed: seeds in turn, the batches' order rotating
    (no B always runs first after the machine idled)."""
    return [{"workload": workload.name, "batch": b, "seed": seed, "version": protocol.version}
            for seed, b in rotated_schedule(protocol.selection_seeds, batches)]


def scoring_specs(workload: WorkloadProtocol, protocol: Protocol, arms: dict[str, Any],
                  adaptive: bool) -> list[dict[str, Any]]:
    """On every scoring seed: the adaptive arm (when train has batch=), the best fixed B
    and the static choice of each target, and B = M0; each (B, seed) once. Their order
    rotates from seed to seed where the protocol says so (version 2), else the adaptive
    arm runs first."""
    batches = [*arms["best"].values(), *arms["static"].values(), arms["reference_batch"]]
    chosen = [ADAPTIVE] * adaptive + sorted({b for b in batches if b is not None})
    if getattr(protocol, "rotate_scored_arms", False):
        schedule = rotated_schedule(protocol.scoring_seeds, chosen)
    else:
        schedule = [(seed, b) for seed in protocol.scoring_seeds for b in chosen]
    return [{"workload": workload.name, "batch": b, "seed": seed, "version": protocol.version}
            for seed, b in schedule]


def train_run(spec: dict[str, Any], workload: WorkloadProtocol, plan) -> dict[str, Any]:
    """One `tula_ray.train` to the late target; its record (what the report reads)."""
    import tula_ray

    adaptive = spec["batch"] == ADAPTIVE
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tula-adaptive-batch-") as storage:
        result = tula_ray.train(
            plan if adaptive else with_batch(plan, spec["batch"]), STRATEGY,
            batch="adaptive" if adaptive else "fixed",
            workload=protocol_workload(workload), epochs=workload.max_epochs,
            target_accuracy=max(workload.targets),
            eval_every_samples=workload.eval_every_samples, seed=spec["seed"],
            storage_path=storage, verbose=0)
        fields = target_run_fields(result)
    return {**spec, **fields, "wall_s": time.perf_counter() - started}


def target_run_fields(result) -> dict[str, Any]:
    """What a run to a target keeps of its `tula_ray.train` result (the reports read it),
    taken while its storage exists (the evaluations come from its checkpoint): the
    evaluations, their mean seconds, the final test accuracy, the epochs and the notes."""
    evaluations = json.loads(result.evaluations.to_json(orient="records"))
    metrics = result.metrics
    return {"evaluations": evaluations,
            "eval_seconds_each": float(metrics["val_seconds"].sum()) / max(len(evaluations), 1),
            "test_accuracy": float(metrics["test_accuracy"].dropna().iloc[-1]),
            "epochs": int(len(metrics)), "notes": list(result.notes)}


def run_missing(specs: list[dict], workload: WorkloadProtocol, plan, log: Path,
                limit_s: float) -> int:
    """Trains the specs `log` does not record yet, appending each record as it ends; none
    starts once the log's runs' wall passes `limit_s`. Returns the specs left undone."""
    done = {run_key(r) for r in read_runs(log)}
    left = 0
    for spec in specs:
        if run_key(spec) in done:
            continue
        if sum(r["wall_s"] for r in read_runs(log)) >= limit_s:
            left += 1
            continue
        record = train_run(spec, workload, plan)
        with open(log, "a") as stream:
            stream.write(json.dumps(record, default=float) + "\n")
        done.add(run_key(spec))
    return left


def gpu_record(workloads: list[str]) -> dict[str, Any]:
    """The GPU step times the projection uses: gpu-acceptance's recorded results."""
    # a quick run's, or a run's partial file (git-ignored, never a record), is left out
    paths = sorted(p for p in RESULTS_DIR.glob(GPU_RESULTS_GLOB)
                   if "_quick" not in p.stem and not p.stem.endswith(".partial"))
    recorded = [json.loads(p.read_text()) for p in paths]
    step_s = {name: {str(b): s for b, s in gpu_step_seconds(recorded, name).items()}
              for name in workloads}
    gpus = sorted({r.get("environment", {}).get("gpu", "?") for r in recorded})
    source = (f"the statistical curves here times the step times {', '.join(p.name for p in paths)}"
              f" recorded on {', '.join(gpus)} (fp32, one GPU, the whole global batch)"
              if paths else "no projection: no GPU step times recorded (run gpu-acceptance)")
    return {"step_s": step_s, "source": source}


def run(quick: bool = False) -> dict:
    return carry_out(Benchmark(NAME, quick), QUICK if quick else PROTOCOL)


def runner_of(version) -> Callable[..., dict]:
    """`run(quick)` of a later protocol version's benchmark: this runner on the version's
    PROTOCOL (--quick: its QUICK), its files named RESULTS_NAME (`version`: the version's
    protocol module)."""
    def run_version(quick: bool = False) -> dict:
        return carry_out(Benchmark(version.RESULTS_NAME, quick),
                         version.QUICK if quick else version.PROTOCOL)
    return run_version


def inputs_of(benchmark: Benchmark, protocol: Protocol) -> tuple[Benchmark, int]:
    """Whose plans and selection runs `protocol` uses, and their version: its own (it
    searches and runs them), or a recorded earlier version's that it reads (version 3:
    version 2's)."""
    source = getattr(protocol, "inputs_from", None)
    if source is None:
        return benchmark, protocol.version
    return Benchmark(source), protocol.inputs_version


def recorded_plan(workload: WorkloadProtocol, inputs: Benchmark):
    """An earlier version's plan, read; never searched again in its place."""
    from tula_ray.planning.plan import Plan

    path = inputs.path(f"_{workload.name}.plan.json")
    if not path.exists():
        raise RuntimeError(f"the protocol reads {path.name}, which is not recorded: run "
                           f"{inputs.name}'s benchmark first")
    return Plan.from_json(path)


def recorded_selection(workload: WorkloadProtocol, protocol: Protocol, batches: list[int],
                       inputs: Benchmark, version: int) -> list[dict]:
    """An earlier version's selection runs, every one the protocol's selection asks for,
    read from its log (none is run again in its place)."""
    specs = selection_specs(workload, dataclasses.replace(protocol, version=version), batches)
    done = {run_key(r): r for r in read_runs(inputs.path(".runs.jsonl"))}
    missing = [spec for spec in specs if run_key(spec) not in done]
    if missing:
        raise RuntimeError(f"{inputs.name}.runs.jsonl lacks {len(missing)} of the selection "
                           f"runs the protocol reads, e.g. {missing[0]}")
    return [done[run_key(spec)] for spec in specs]


def carry_out(benchmark: Benchmark, protocol: Protocol) -> dict:
    """Carries out `protocol` (version 1's or a later one), its plans, log and result
    named after `benchmark`; a protocol that reads an earlier version's plans and
    selection runs (`inputs_of`) runs only its scored arms."""
    import tula_ray
    from tula_ray.cluster import ray_session

    quick = benchmark.quick
    if split_digest() != SPLIT_SHA256:
        raise RuntimeError("the protocol's split moved (torch permutes differently here): "
                           "its digest is not SPLIT_SHA256; no run on another split")
    log = benchmark.log()
    inputs, inputs_version = inputs_of(benchmark, protocol)
    adaptive = adaptive_support(tula_ray.train)
    arms, left, selection = {}, 0, []
    with ray_session(None, None):
        for workload in protocol.workloads:
            if inputs is benchmark:  # its own plan and selection runs
                plan = make_plan(workload, quick, benchmark.path(
                    f"_{workload.name}.plan.json"))
                left += run_missing(selection_specs(workload, protocol, fixed_batches(plan)),
                                    workload, plan, log, protocol.total_limit_s)
                selected = read_runs(log)
            else:  # an earlier version's, read
                plan = recorded_plan(workload, inputs)
                selected = recorded_selection(workload, protocol, fixed_batches(plan), inputs,
                                              inputs_version)
                selection += selected
            arms[workload.name] = planned_arms(plan, workload, selected, protocol)
            left += run_missing(scoring_specs(workload, protocol, arms[workload.name],
                                              adaptive == "ok"),
                                workload, plan, log, protocol.total_limit_s)
            arms[workload.name]["switches"] = explained_switches(plan, arm_runs(
                read_runs(log), workload.name, ADAPTIVE, protocol.scoring_seeds))
    own = [r for r in read_runs(log) if r["version"] == protocol.version]
    return benchmark.record({"quick": quick, "protocol": protocol_record(protocol),
                             "workloads": arms, "runs": selection + own,
                             "adaptive_arm": adaptive,
                             "limit": limit_line(own, left, protocol, inputs, selection),
                             "gpu": gpu_record([w.name for w in protocol.workloads])}, report)


def limit_line(own: list[dict], left: int, protocol: Protocol, inputs: Benchmark,
               read: list[dict]) -> str:
    """The runs this version ran against its limit, and those it read from another."""
    wall = sum(r["wall_s"] for r in own)
    line = (f"{len(own)} runs, {wall / 3600:.2f} h of the {protocol.total_limit_s / 3600:g} h "
            f"limit" + (f"; {left} runs not started (the limit)" if left else "") + ".")
    if read:
        line += (f" The plans and the {len(read)} selection runs are read from "
                 f"results/{inputs.name}.*, recorded before.")
    return line
