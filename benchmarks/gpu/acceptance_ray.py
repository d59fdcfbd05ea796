"""The Ray half of `python -m benchmarks gpu-acceptance` (issue 26, item 7): run by
`gpu_acceptance.run` only where Ray is importable.

  - a one-GPU full search (`tula_ray.search`, N = 1, strategy "full") of each synthetic
    workload, and `tula_ray.train` of its choice for 2 epochs, each epoch's `seconds`
    against the plan's `epoch_time_s` for that (N, B);
  - then each search again: per B the two runs' step and compute times, whether they
    agree within the rows' own measured spread (`step_time_spread`), and a flag where the
    second run's compute time is smaller than the first's by more than that spread (the
    clocks were not ramped up when the first one ran);
  - then bf16 against fp32: the same search in bf16, its step time at each B over fp32's
    (on a GPU only: the CPU emulates bf16);
In that order, so that a run short of time cuts the least needed part: `train` on a GPU
ran only from 2026-11-30, behind the second searches, which had already agreed.
NCCL's check is the Ray-free half's (`synced_oom`: one rank out of memory in a synced
step). Two workers on halves of one GPU, checked here before issue 46, exercised NCCL's
refusal of a duplicate GPU, not a hang.
Ray is imported inside the functions: `report` reads a saved result anywhere.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

from benchmarks.common import markdown_table

TRAIN_EPOCHS = 2
# (name, samples, min_batch, max_batch) of each search; the quick one is a CPU smoke test.
# A search takes ~14-20 s a B on an H200 (a worker group's start, then its steps: 104 s
# for the CNN's 7 B of 32-2048 on 2026-11-28; 72 s for its 4 B of 256-2048 and 59-66 s for
# resnet18's 3 of 128-512 on 2026-11-30), a `train` of 2 short epochs ~45 s (its launch),
# and the Ray half had ~240 s after the Ray-free half's ~290 s. So the searches span 3
# and 2 B: both searches and both trains take ~190 s, and the CNN's second search fits.
SEARCHES = (("cnn", 60_000, 512, 2048), ("resnet18", 20_000, 256, 512))
QUICK_SEARCHES = (("cnn", 256, 64, 64),)
QUICK_TIMING = dict(warmup_steps=1, measure_steps=3, measure_seconds=0.1)


def _search(name: str, samples: int, low: int, high: int, precision: str, storage: str,
            quick: bool):
    import tula_ray
    from benchmarks.gpu.synthetic import synthetic_workload

    return tula_ray.search(synthetic_workload(name, samples), cluster_sizes=(1,),
                           search_strategy="full", min_batch=low, max_batch=high,
                           precision=precision, training_strategy="lbt", epochs=TRAIN_EPOCHS,
                           storage_path=storage,
                           **(QUICK_TIMING if quick else {}))


def _profiled(plan) -> dict[int, dict[str, float]]:
    rows = plan.profiles[plan.profiles["status"] == "ok"]
    return {int(r["global_batch"]): {"step_s": float(r["step_time_s"]),
                                     "compute_s": float(r["compute_time_s"]),
                                     "spread": float(r["step_time_spread"])}
            for _, r in rows.iterrows()}


def twice(first, second) -> list[dict[str, Any]]:
    """Per B of both runs: their step and compute times, agreement within the larger of
    the two rows' spreads, and the clock flag (second compute time smaller by more)."""
    a, b = _profiled(first), _profiled(second)
    rows = []
    for batch in sorted(set(a) & set(b)):
        spread = max(a[batch]["spread"], b[batch]["spread"])
        step_change = b[batch]["step_s"] / a[batch]["step_s"] - 1
        compute_change = b[batch]["compute_s"] / a[batch]["compute_s"] - 1
        rows.append({"global_batch": batch, "step_s": [a[batch]["step_s"], b[batch]["step_s"]],
                     "compute_s": [a[batch]["compute_s"], b[batch]["compute_s"]],
                     "spread": spread, "step_change": step_change,
                     "agree": abs(step_change) <= spread,
                     "clocks_not_ramped": compute_change < -spread})
    return rows


def trained(plan, name: str, samples: int, storage: str) -> dict[str, Any]:
    """`tula_ray.train` of the plan's choice for TRAIN_EPOCHS epochs against its epoch time."""
    import tula_ray
    from benchmarks.gpu.synthetic import synthetic_workload

    result = tula_ray.train(plan, "lbt", workload=synthetic_workload(name, samples),
                            epochs=TRAIN_EPOCHS, storage_path=storage)
    seconds = [float(s) for s in result.metrics["seconds"]]
    predicted = float(plan.chosen["epoch_time_s"])
    return {"num_workers": plan.choice.num_workers, "global_batch": plan.choice.global_batch,
            "predicted_epoch_s": predicted, "epoch_seconds": seconds,
            "ratio": predicted / seconds[-1]}


def ray_half(quick: bool, device, time_left=lambda: float("inf")) -> dict[str, Any]:
    """Per workload the fp32 search and `train` of its choice; then each workload's second
    fp32 search (the two runs compared); then, on a GPU, each workload's bf16 search
    against fp32's (last: the Ray-free half's step rows compare the precisions too). Each
    part is begun only while `time_left()` covers the longest search so far (`train`, half
    of it), else marked "out of time": what is cut first is the least needed."""
    from tula_ray.cluster import ray_session

    storage = tempfile.mkdtemp(prefix="tula-gpu-acceptance-")
    workloads: list[dict[str, Any]] = []
    try:
        with ray_session(None, None):
            for name, samples, low, high in QUICK_SEARCHES if quick else SEARCHES:
                if name != "cnn" and not _has_torchvision():
                    workloads.append({"workload": name, "skipped": "torchvision not installed"})
                    continue
                workloads.append(_searched_and_trained(name, samples, low, high, storage,
                                                       quick, time_left, workloads))
            searched = [w for w in workloads if "plans" in w]
            for entry in searched:
                _searched_again(entry, storage, quick, time_left, workloads)
            for entry in searched:
                entry["bf16_over_fp32"] = _bf16_over_fp32(
                    entry, entry["plans"][-1], storage, quick, device, time_left, workloads)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return {"workloads": [_recorded(entry) for entry in workloads],
            "train_epochs": TRAIN_EPOCHS}


def _recorded(entry: dict[str, Any]) -> dict[str, Any]:
    """What is recorded of a workload: its fp32 plans compared when both searches ran
    (`twice`), else the second run marked out of time; not the Plans themselves."""
    plans = entry.pop("plans", None)
    if plans is not None:
        entry["twice"] = twice(*plans) if len(plans) == 2 else []
        if len(plans) < 2:
            entry["second_run"] = "out of time"
    return entry


def _longest(workloads: list[dict]) -> float:
    return max((s for w in workloads for s in w.get("search_s", [])), default=0.0)


def _timed_search(entry: dict, low: int, high: int, precision: str, storage: str,
                  quick: bool):
    started = time.perf_counter()
    plan = _search(entry["workload"], entry["samples"], low, high, precision, storage, quick)
    entry["search_s"].append(time.perf_counter() - started)
    return plan


def _searched_and_trained(name: str, samples: int, low: int, high: int, storage: str,
                          quick: bool, time_left, done: list[dict]) -> dict[str, Any]:
    """One workload's first fp32 search and `train` of its choice, each begun only while
    the time left covers the longest search so far (`train`: half of it)."""
    out_of_time = "out of time"
    entry: dict[str, Any] = {"workload": name, "samples": samples, "search_s": [],
                             "range": [low, high]}
    if time_left() <= _longest([*done, entry]):
        return {"workload": name, "skipped": out_of_time}
    plan = _timed_search(entry, low, high, "fp32", storage, quick)
    entry.update(plans=[plan], choice=plan.choice.to_dict(),
                 train=trained(plan, name, samples, storage)
                 if time_left() > _longest([*done, entry]) / 2 else {"skipped": out_of_time})
    print({k: v for k, v in entry.items() if k != "plans"}, flush=True)
    return entry


def _searched_again(entry: dict[str, Any], storage: str, quick: bool, time_left,
                    workloads: list[dict]) -> None:
    """The workload's second fp32 search, while time is left (`_recorded` compares them)."""
    if time_left() > _longest(workloads):
        entry["plans"].append(_timed_search(entry, *entry["range"], "fp32", storage, quick))


def _bf16_over_fp32(entry: dict, fp32_plan, storage: str, quick: bool, device, time_left,
                    workloads: list[dict]) -> dict[int, float] | str:
    """bf16's profiled step over fp32's at each B (on a GPU: the CPU emulates bf16)."""
    if device.type != "cuda":
        return "skipped: on the CPU bf16 is emulated (slower, not what is accepted); a GPU " \
               "compares it"
    if time_left() <= _longest(workloads):
        return "out of time"
    bf16 = _profiled(_timed_search(entry, *entry["range"], "bf16", storage, quick))
    fp32 = _profiled(fp32_plan)
    return {b: bf16[b]["step_s"] / fp32[b]["step_s"] for b in sorted(set(fp32) & set(bf16))}


def _has_torchvision() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


def report(ray: dict[str, Any]) -> str:
    """The Ray half's markdown."""
    lines = ["### Ray half: one-GPU full searches (N = 1), `train`, bf16\n",
             "Each search ran twice: step and compute ms of run 1 / run 2; they agree when the "
             "step times differ by at most the larger row spread (`step_time_spread`); a second "
             "compute time smaller by more than that spread means the clocks had not ramped up "
             "for the first.\n"]
    body = [[w["workload"], r["global_batch"],
             " / ".join(f"{1e3 * s:.3f}" for s in r["step_s"]),
             " / ".join(f"{1e3 * s:.3f}" for s in r["compute_s"]), f"{r['step_change']:+.1%}",
             f"{r['spread']:.1%}", "yes" if r["agree"] else "no",
             "not ramped up" if r["clocks_not_ramped"] else "ok"]
            for w in ray["workloads"] if "twice" in w for r in w["twice"]]
    lines.append(markdown_table(["workload", "B", "step ms", "compute ms", "change",
                                 "spread", "agree", "clocks"], body))
    lines += ["", f"`tula_ray.train` of the first plan's choice for {ray['train_epochs']} "
              "epochs: each epoch's `seconds` against the plan's `epoch_time_s` (the last "
              "epoch compared; the first warms up); bf16's profiled step over fp32's (run 2) at "
              "each B.\n"]
    body = []
    for w in ray["workloads"]:
        if "skipped" in w:
            body.append([w["workload"], "-", "-", "-", "-", w["skipped"]])
            continue
        t = w["train"]
        if "skipped" in t:
            body.append([w["workload"], "-", "-", "-", "-", f"train: {t['skipped']}"])
            continue
        body.append([w["workload"], f"N={t['num_workers']} B={t['global_batch']}",
                     f"{t['predicted_epoch_s']:.2f}",
                     " / ".join(f"{s:.2f}" for s in t["epoch_seconds"]), f"{t['ratio']:.3f}",
                     w.get("bf16_over_fp32", "-") if not isinstance(w.get("bf16_over_fp32"),
                                                                     dict) else
                     ", ".join(f"B={b}: {r:.2f}" for b, r in w["bf16_over_fp32"].items())])
    lines.append(markdown_table(["workload", "train", "plan epoch s", "train epoch s",
                                 "plan / last epoch", "bf16 / fp32 step"], body))
    lines += [f"- {w['workload']}: the searches took "
              f"{', '.join(f'{s:.0f}' for s in w['search_s'])} s"
              + (f"; its second fp32 run: {w['second_run']}" if "second_run" in w else "")
              for w in ray["workloads"] if w.get("search_s")]
    return "\n".join(lines)
