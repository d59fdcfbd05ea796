"""The memory bound on a GPU (issue 46, items 2 and 3), part of `gpu-acceptance`'s Ray-free
half: per workload and dataset cap (60k and 500k samples),
  - the bound the search finds: its probe and its check (`planning.bounds.checked_bound`,
    doubling then bisection), the same functions the probe's Ray task runs on a worker,
    with the AGS optimizer's state in the budget as `train` needs it;
  - the true bound under the same limit (the budget less the headroom, on the same
    reserved-memory peaks), bisected to within 1 %: the search's bound must be at most it
    and at least 0.95x it (what `measured_bound` promises);
  - the true bound of the device: the largest local batch whose step runs without running
    out of memory while the dataset the data path keeps on the GPU is there, bisected to
    within 1 % from the search's bound (or the cap, when that runs);
  - two epochs of `fit` with AGS at the bound found, each scored on the test set (one
    evaluation batch), with `max_memory_reserved` and `max_memory_allocated` over them
    (against the bound's own measured step: what AGS's step and the evaluation add), and
    whether they ran out.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch

from benchmarks.gpu.synthetic import synthetic_workload

CAPS = (60_000, 500_000)
GRID = (("cnn", CAPS), ("resnet18", CAPS))
QUICK_GRID = (("cnn", (512,)),)  # a CPU smoke test: no bisection (nothing runs out)
TRUE_TOLERANCE = 0.01
FIT_EPOCHS = 2
STRATEGY = "ags"
CPU_SHARE = 0.25  # of RAM, on a CPU (`tula_ray.cluster.CPU_MEMORY_SHARE_DEFAULT`, no Ray here)


def _measure(workload, device: torch.device, example) -> Callable[[int], float | None]:
    from tula_ray.training.measure import peak_or_none

    return lambda b: peak_or_none(workload, b, device, example)


def search_bound(name: str, cap: int, device: torch.device) -> dict[str, Any]:
    """The search's bound at `cap` (its probe, budget and check, as `runs.search` calls
    them for N = 1 with the AGS strategy), with what it measured."""
    from tula_ray.models.memory import HEADROOM_DEFAULT, probe_batches
    from tula_ray.planning.bounds import (checked_bound, fitted_probe, memory_budget_bytes,
                                          probe_min_local_batch)
    from tula_ray.space import MIN_BATCH_DEFAULT
    from tula_ray.training.host_allocator import node_memory_bytes
    from tula_ray.training.probe_task import checked_and_measured

    started = time.perf_counter()
    measured = checked_and_measured(
        synthetic_workload(name, cap), None,
        probe_batches(probe_min_local_batch(MIN_BATCH_DEFAULT, (1,))), device, STRATEGY)
    workload, facts = measured["workload"], measured["facts"]
    probe = fitted_probe(measured)
    budget = memory_budget_bytes(
        probe, declared_gb=None, num_workers=1, use_gpu=device.type == "cuda",
        cpu_share_bytes=CPU_SHARE * node_memory_bytes())
    probe = checked_bound(probe, _measure(workload, device, facts.example), budget,
                          headroom=HEADROOM_DEFAULT, space=candidates(cap), doubling=True)
    return {"workload": workload, "example": facts.example, "probe": probe,
            "limit_bytes": budget * (1 - HEADROOM_DEFAULT), "budget_bytes": budget,
            "seconds": time.perf_counter() - started}


def known_points(probe) -> list[tuple[int, float | None]]:
    """Every (local batch, peak) the search measured, None where it ran out of memory."""
    return [(r["local_batch"], r["peak_mem_bytes"]) for r in probe.rows] + [
        (c["local_batch"], None) for c in probe.bound_checks if c["peak_mem_bytes"] is None]


def device_bound(workload, example, cap: int, start: int, device: torch.device
                 ) -> tuple[int, list]:
    """The largest local batch (within 1 %, at most `cap`) whose step runs without running
    out of memory while the datasets the data path keeps on the GPU take their place,
    doubled then bisected from `start` (a batch the search found to fit its limit)."""
    from tula_ray.models.bound_search import measured_bound
    from tula_ray.training.batches import device_resident_bytes

    resident = sum(device_resident_bytes(data, device, workload.data_on_device)
                   for data in (workload.train_dataset_fn(), workload.test_dataset_fn()))
    held = torch.empty(resident, dtype=torch.uint8, device=device) if resident else None
    try:
        measure = _measure(workload, device, example)
        return measured_bound(measure, math.inf, cap=cap, measured=[(start, measure(start))],
                              tolerance=TRUE_TOLERANCE)
    finally:
        del held
        if device.type == "cuda":
            torch.cuda.empty_cache()


def ags_at_bound(name: str, cap: int, local_batch: int, device: torch.device) -> dict:
    """FIT_EPOCHS epochs of `fit` with AGS at global batch `local_batch` (N = 1), each
    epoch scored on the test set; the reserved peak over them, or the out of memory."""
    from tula_ray.failures import is_out_of_memory
    from tula_ray.training.run import fit

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        frame = fit(synthetic_workload(name, cap), global_batch=local_batch,
                    strategy=STRATEGY, epochs=FIT_EPOCHS, device=device)
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        return {"out_of_memory": True, "error": str(error).splitlines()[0][:200]}
    cuda = device.type == "cuda"
    return {"out_of_memory": False, "epoch_seconds": [float(s) for s in frame["seconds"]],
            "test_accuracy": [float(a) for a in frame["test_accuracy"]],
            "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
            # what the tensors took at most, apart from the allocator's cache: above the
            # bound's measured step, it is AGS's step and the evaluation's own memory
            "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda
            else None,
            "total_memory_bytes": torch.cuda.get_device_properties(device).total_memory
            if cuda else None}


def check(name: str, cap: int, device: torch.device) -> dict[str, Any]:
    """One workload at one cap: the search's bound, both true bounds, AGS at the bound."""
    from tula_ray.models.bound_search import measured_bound

    found = search_bound(name, cap, device)
    probe, workload, example = found["probe"], found["workload"], found["example"]
    bound, needed, points = probe.max_local_batch, search_cap(cap), known_points(probe)
    started = time.perf_counter()
    under_limit, limit_tries = measured_bound(
        _measure(workload, device, example), found["limit_bytes"], cap=needed,
        measured=points, tolerance=TRUE_TOLERANCE)  # up to the search's cap
    runs, device_tries = device_bound(workload, example, needed, max(bound, 1), device)
    true_s = time.perf_counter() - started
    return {"workload": name, "cap": cap, "search_cap": needed, "bound": bound,
            "search_tries": [c["local_batch"] for c in probe.bound_checks],
            "search_s": found["seconds"], "limit_bytes": found["limit_bytes"],
            "budget_bytes": found["budget_bytes"],
            "strategy_state_bytes": probe.strategy_state_bytes,
            "bound_peak_bytes": dict(points).get(bound),
            "true_under_limit": under_limit, "limit_tries": len(limit_tries),
            "true_device": runs, "device_tries": len(device_tries), "true_s": true_s,
            "ags": ags_at_bound(name, cap, bound, device) if bound else {"skipped": "no bound"}}


def run(device: torch.device, quick: bool, time_left: Callable[[], float],
        on_row: Callable[[dict], None]) -> list[dict[str, Any]]:
    """Every (workload, cap) of the grid while time is left (a row says when it was not)."""
    rows = []
    for name, caps in QUICK_GRID if quick else GRID:
        for cap in caps:
            if time_left() <= 0:
                rows.append({"workload": name, "cap": cap, "skipped": "out of time"})
                continue
            try:
                rows.append(check(name, cap, device))
            except Exception as error:  # noqa: BLE001 - one check failing keeps the others
                rows.append({"workload": name, "cap": cap,
                             "error": f"{type(error).__name__}: {error}"[:300]})
            on_row(rows[-1])
    return rows


def candidates(cap: int):
    """The search's candidates at N = 1 on a dataset of `cap` samples (B from min_batch,
    doubling, up to the cap), before the memory bound: what its check measures up to."""
    from tula_ray.planning.bounds import candidate_space
    from tula_ray.space import MIN_BATCH_DEFAULT

    return candidate_space((1,), min_batch=MIN_BATCH_DEFAULT, max_batch=None,
                           dataset_size=cap)


def search_cap(cap: int) -> int:
    """The largest local batch the search's candidates need (`candidates`): its bound is
    never above it, nor need it be."""
    return max(c.local_batch for c in candidates(cap).candidates())


def verdict(row: dict[str, Any]) -> str:
    """The goals of issue 46 for one row, in words: the bound against each true bound,
    both taken up to the search's cap (`search_cap`; a run before it was recorded
    bisected up to the dataset's cap, and a batch that fits there fits below it)."""
    cap = search_cap(row["cap"])
    bound, limit, runs = row["bound"], min(row["true_under_limit"], cap), min(
        row["true_device"], cap)

    def part(true: int, what: str, least: float) -> str:
        if not true:
            return f"nothing fits {what}"
        ok = least * true <= bound <= true
        return (f"{bound / true:.3f} of {what} ({'ok' if ok else 'missed'}: <= 1, "
                f">= {least})")

    return "; ".join([part(limit, "the true bound under the limit", 0.95),
                      part(runs, "the device's", 0.9)])


def _ags_cell(row: dict[str, Any]) -> str:
    """AGS's epochs at the bound: their seconds, memory and test accuracy. The allocated
    peak beside the bound's measured step, where recorded (since issue 46's second GPU run:
    what AGS's step and the evaluation add, which the bound's probe does not step)."""
    ags, gib = row["ags"], 2**30
    if ags.get("out_of_memory"):
        return "out of memory"
    if "skipped" in ags:
        return ags["skipped"]
    memory = ""
    if ags["max_memory_reserved_bytes"] is not None:
        allocated = ags.get("max_memory_allocated_bytes")
        step = row.get("bound_peak_bytes")
        memory = "{}reserved {:.1f} of {:.1f} GiB; {}".format(
            f"allocated {allocated / gib:.1f}, " if allocated is not None else "",
            ags["max_memory_reserved_bytes"] / gib, ags["total_memory_bytes"] / gib,
            f"the bound's step {step / gib:.1f} GiB; " if step is not None else "")
    return "{} s; {}test acc {}".format(" / ".join(f"{s:.1f}" for s in ags["epoch_seconds"]),
                                        memory,
                                        " / ".join(f"{a:.3f}" for a in ags["test_accuracy"]))


def report(rows: list[dict[str, Any]]) -> list[str]:
    """The bound check's markdown lines."""
    from benchmarks.common import markdown_table

    if not rows:  # a result recorded before issue 46
        return []
    gib = 2**30
    body = []
    for r in rows:
        if "bound" not in r:
            body.append([r["workload"], r["cap"], r.get("skipped") or r.get("error"), *[""] * 6])
            continue
        body.append([r["workload"], f"{r['cap']} ({search_cap(r['cap'])})", r["bound"],
                     f"{r['search_s']:.0f} s, {len(r['search_tries'])} tries",
                     f"{r['true_under_limit']} ({r['limit_tries']} tries)",
                     f"{r['true_device']} ({r['device_tries']} tries)", verdict(r),
                     f"{r['limit_bytes'] / gib:.1f}", _ags_cell(r)])
    return ["", "The memory bound (issue 46): the search's bound (its probe and check: "
            "doubling, then bisection, N = 1, the AGS optimizer's state budgeted) against "
            "the true bound under the same limit (budget less headroom, reserved peaks) and "
            "the device's (the largest local batch that runs, the dataset held on the GPU), "
            f"both bisected to {TRUE_TOLERANCE:.0%}, up to the search's cap (its largest "
            "candidate's local batch: B doubles from 32 up to the dataset); then "
            f"{FIT_EPOCHS} epochs of `fit` with AGS at the bound, each scored on the test "
            "set.\n",
            markdown_table(["workload", "cap (search's)", "bound", "search", "true under limit",
                            "true on device", "bound / true", "limit GiB",
                            f"AGS x {FIT_EPOCHS} epochs at the bound"], body)]

