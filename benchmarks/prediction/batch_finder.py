"""Issue 5 figure (part 4): max-batch discovery, tula-ray's memory probe vs Lightning's finder.

Small CNN (`fashion-mnist-cnn`, SGD), one worker, a declared device memory of 512 MiB.
  tula-ray:  the memory probe (`measure.probe_peaks` + `memory.fit_probe`, run in this
             process without Ray; a search runs `probe_peaks` as one Ray task, whose start is
             not counted here): 3 local batches measured with MemTracker, eq. 3 fitted,
             `memory.max_local_batch` under the declared memory (product headroom, and none),
             then checked as the search checks it (`memory.verified_max_local_batch`:
             peaks measured near the predicted bound); trials = probes + checks.
  Lightning: `Tuner.scale_batch_size` (the BatchSizeFinder callback) on a LightningModule
             training the same model, optimizer and loss on the real Fashion-MNIST, its default
             3 steps per trial, starting at the probe's smallest local batch:
             - "power, max_val": on CPU no allocation fails (NOTES-ENV), so Lightning gets the
               true bound below as max_val: it doubles until the next size reaches max_val
               and returns that next size without running it (lightning 2.6.6: the power
               loop doubles without capping at max_val, so it can exceed max_val);
             - "binsearch, emulated OOM": a CPU device of the declared memory emulated by
               raising the CPU allocator's error (which Lightning treats as an OOM) in any
               step whose batch exceeds the true bound: what Lightning does on a device that
               runs out (power doubling, then bisection, minus its default 5 % margin).
               An emulated OOM fails before any compute, so it is cheaper than a real one.
  truth:     the largest local batch whose measured peak (MemTracker, the measure the
             profiling trainable compares with the declared memory) fits, by bisection
             (memory_accuracy.true_max_local_batch).
Counted for each: trials (local batches run), wall time (imports and Trainer construction
excluded), and the bound it reports against the truth.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings

import torch

from benchmarks.common import Benchmark, markdown_table
from benchmarks.prediction.memory_accuracy import (DEVICE_MEMORY_BYTES, MIN_LOCAL_BATCH,
                                                   QUICK_DEVICE_MEMORY_BYTES, checked_bounds,
                                                   fit_like_probe, peak_of, true_max_local_batch)
from tula_ray.models import memory
from tula_ray.workloads import Workload, get_workload

NAME = "batch_finder"
WORKLOAD = "fashion-mnist-cnn"
STEPS_PER_TRIAL = 3  # Lightning's default
MAX_VAL_UNBOUNDED = 2**20  # the emulated-OOM run: memory, not max_val, stops Lightning
EMULATED_OOM = "DefaultCPUAllocator: can't allocate memory: emulated device of {} bytes"


def _lightning_finder(workload: Workload, mode: str, max_val: int, oom_above: int | None,
                      device_bytes: float) -> dict:
    """One `Tuner.scale_batch_size` run; its trials as the model saw them."""
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = MIN_LOCAL_BATCH
            self.model, self.loss_fn = workload.model_fn(), workload.loss_fn()
            self.dataset = workload.train_dataset_fn()
            self.trials: list[dict] = []

        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size,
                                               shuffle=True)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            if batch_idx == 0:
                self.trials.append({"batch_size": self.batch_size, "oom": False})
            if oom_above is not None and len(inputs) > oom_above:
                self.trials[-1]["oom"] = True
                raise RuntimeError(EMULATED_OOM.format(int(device_bytes)))
            return self.loss_fn(self.model(inputs), targets)

        def configure_optimizers(self):
            return workload.optimizer_fn(self.parameters())

    module = Module()
    with tempfile.TemporaryDirectory() as scratch:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0,
                             default_root_dir=scratch)
        started = time.perf_counter()
        found = Tuner(trainer).scale_batch_size(module, mode=mode, init_val=MIN_LOCAL_BATCH,
                                                max_val=max_val, steps_per_trial=STEPS_PER_TRIAL)
        wall_s = time.perf_counter() - started
    return {"mode": mode, "max_val": max_val, "emulated_oom_above": oom_above,
            "trials": module.trials, "num_trials": len(module.trials),
            "bound": int(found), "wall_s": wall_s}


def run(quick: bool = False) -> dict:
    device_bytes = QUICK_DEVICE_MEMORY_BYTES if quick else DEVICE_MEMORY_BYTES
    load_before = os.getloadavg()[0]  # the machine is shared: wall times depend on its load
    device = torch.device("cpu")  # Lightning's CPU run and the probe on the same device
    probe_workload = get_workload(WORKLOAD, data="fake")  # the probe needs shapes, not data
    params, probe = fit_like_probe(probe_workload, device)
    tula = {"params": params.to_dict(), "probe_trials": probe["local_batches"],
            "probe_wall_s": probe["wall_s"]}
    # The search's bound: the probe's fit checked by measuring near it (trainables/memory_probe.py).
    for key, bound in checked_bounds(probe_workload, params, probe, device_bytes, device).items():
        checks = [c["local_batch"] for c in bound["checks"]]
        tula[key] = {"bound": bound["bound"], "checks": checks,
                     "trials": len(probe["local_batches"]) + len(checks),
                     "wall_s": probe["wall_s"] + bound["wall_s"]}
    started = time.perf_counter()
    true_b, peaks = true_max_local_batch(
        peak_of(probe_workload, device), device_bytes,
        memory.max_local_batch(params, device_bytes, headroom=0.0))
    truth = {"bound": true_b, "search_wall_s": time.perf_counter() - started,
             "search": [{"local_batch": b, "peak_mem_bytes": p} for b, p in sorted(peaks.items())]}

    workload = get_workload(WORKLOAD)  # Lightning trains on the real Fashion-MNIST
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(num_workers|does not have many workers).*")
        lightning = {
            "power, max_val": _lightning_finder(workload, "power", true_b, None, device_bytes),
            "binsearch, emulated OOM": _lightning_finder(workload, "binsearch", MAX_VAL_UNBOUNDED,
                                                         true_b, device_bytes),
        }
    return Benchmark(NAME, quick).record(
        {"workload": WORKLOAD, "declared_device_memory_bytes": device_bytes,
         "headroom": memory.HEADROOM_DEFAULT, "init_local_batch": MIN_LOCAL_BATCH,
         "steps_per_trial": STEPS_PER_TRIAL, "tula": tula, "lightning": lightning,
         "truth": truth, "load_avg_1min": [load_before, os.getloadavg()[0]]}, report)


def report(r: dict) -> str:
    true_b = r["truth"]["bound"]

    def row(finder: str, trials: int, wall_s: float, bound: int, note: str) -> list:
        return [finder, trials, f"{wall_s:.1f}", bound, f"{bound / true_b - 1:+.1%}", note]

    tula = r["tula"]
    probes = ", ".join(map(str, tula["probe_trials"]))
    rows = [row(f"tula-ray memory probe + bound check, {label}", tula[key]["trials"],
                tula[key]["wall_s"], tula[key]["bound"],
                f"probes b = {probes}; checks b = {', '.join(map(str, tula[key]['checks']))}")
            for key, label in (("headroom", f"{r['headroom']:.0%} headroom"),
                               ("no_headroom", "no headroom"))]
    for label, run in r["lightning"].items():
        tried = ", ".join(f"{t['batch_size']}{' (OOM)' if t['oom'] else ''}" for t in run["trials"])
        largest_run = max(t["batch_size"] for t in run["trials"] if not t["oom"])
        untested = (f"returned {run['bound']}, above every size it ran; "
                    if run["bound"] > largest_run else "")
        note = (f"max_val = true b; {untested}tried {tried}" if run["emulated_oom_above"] is None
                else f"{untested}tried {tried}")
        rows.append(row(f"Lightning `scale_batch_size` ({label})", run["num_trials"], run["wall_s"],
                        run["bound"], note))
    table = markdown_table(["finder", "trials", "wall time (s)", "bound found", "vs true b", "notes"],
                           rows)
    return f"""### Max-batch discovery: memory probe vs Lightning's BatchSizeFinder (issue 5)

`{r['command']}` — commit {r['commit']}, {r['date']}, {r['machine']}; load average
(1 min) {r['load_avg_1min'][0]:.1f} before / {r['load_avg_1min'][1]:.1f} after (shared machine)

Small CNN, one CPU worker, declared device memory
{r['declared_device_memory_bytes'] / 2**20:.0f} MiB. True largest local batch: **{true_b}**
(largest b whose MemTracker peak fits, by bisection: {len(r['truth']['search'])} peaks measured,
{r['truth']['search_wall_s']:.0f} s). The probe runs here without Ray (in a search it is one Ray
task). Lightning: {r['steps_per_trial']} training steps per trial on the real Fashion-MNIST from
b = {r['init_local_batch']}; on CPU it never sees an OOM, so it is given the true b as max_val,
and once more with an OOM emulated above the true b (binsearch, default 5 % margin; an
emulated OOM fails before any compute, cheaper than a real one).
Trials = local batches run; wall time excludes imports and Trainer construction.

{table}
"""
