"""A search survives its driver (issue 13, item 2): a driver script with its own Workload is
killed with SIGKILL in the middle of a search (its sweep held at one batch by a gate in the
model, so that the kill does not race the search's end); the same script, run again with
resume=True, continues the same experiment through `Tuner.restore`.

Both drivers are subprocesses that join the run's shared Ray (RAY_ADDRESS), as drivers
on a cluster do; the first is killed with SIGKILL, and so is every process it started.
Ray ends a dead driver's job: its trials and worker groups go with it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from process_tree import kill_tree
from tula_ray.cluster import ADDRESS_ENV
from tula_ray.planning.plan import Plan, build_plan

pytestmark = pytest.mark.ray

DRIVER = '''
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray.workloads import Workload

GATE, GATE_BATCH = GATE_PATH, GATE_AT_BATCH


def data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.rand((1024, 1, 8, 8), generator=generator),
                         torch.randint(0, 4, (1024,), generator=generator))


class Gate(nn.Module):
    """Holds a step at B = GATE_BATCH (above the memory probe's batches) until the test
    opens the gate: the first driver is killed while it waits, the smaller batches' rows
    saved."""

    def forward(self, x):
        while x.shape[0] == GATE_BATCH and not os.path.exists(GATE):
            time.sleep(0.05)
        return x


def model():
    return nn.Sequential(Gate(), nn.Flatten(), nn.Linear(64, 256), nn.ReLU(),
                         nn.Linear(256, 4))


if __name__ == "__main__":
    workload = Workload("resume-mlp", model_fn=model, train_dataset_fn=data, epochs=2)
    plan = tula_ray.search(workload, search_strategy="full", cluster_sizes=(1,), min_batch=32,
                           max_batch=512, measure_steps=4, measure_seconds=0.5,
                           storage_path=sys.argv[1], name="resumable", resume=True)
    plan.to_json(sys.argv[2])
'''
TIMEOUT_S = 600
BATCHES = (32, 64, 128, 256, 512)  # one worker group profiles them, smallest first
GATE_AT = 256  # the first driver's sweep waits here: three rows saved, two left


def saved_state(experiment: Path) -> dict | None:
    """The searcher's state as Tune last saved it with the experiment, if it has."""
    states = sorted(experiment.glob("searcher-state-*.pkl"), key=lambda p: p.stat().st_mtime)
    if not states:
        return None
    try:
        return json.loads(states[-1].read_text())
    except (json.JSONDecodeError, OSError):  # caught while Tune writes it
        return None


def run_driver(script: Path, storage: Path, out: Path, address: str) -> subprocess.Popen:
    # Tune saves the experiment (and the searcher) every second instead of every >= 10 s,
    # so that the kill below lands between two saves with rows in the first.
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1", ADDRESS_ENV: address}
    return subprocess.Popen([sys.executable, str(script), str(storage), str(out)],
                            cwd=script.parent, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def killed_then_resumed(ray_session, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    script, storage = tmp / "driver.py", tmp / "ray_results"
    gate = tmp / "gate"
    script.write_text(DRIVER.replace("GATE_PATH", repr(str(gate)))
                      .replace("GATE_AT_BATCH", str(GATE_AT)))
    experiment = storage / "resumable"
    first = run_driver(script, storage, tmp / "never.json", ray_session)
    deadline, before = time.monotonic() + TIMEOUT_S, None
    try:
        while time.monotonic() < deadline and first.poll() is None:
            state = saved_state(experiment)
            # The candidates below the gate measured: the resumed search has the rest left.
            if state and len(state["rows"]) == BATCHES.index(GATE_AT):
                before = state
                break
            time.sleep(0.2)
    finally:
        kill_tree(first.pid, term_first=False)  # the driver and what it started
        first.wait(timeout=60)
    assert before is not None, f"no rows saved before the kill:\n{first.stderr.read()[-3000:]}"
    assert not (tmp / "never.json").exists()
    time.sleep(1)  # the killed group's files are closed
    gate.touch()  # the resumed search's sweep runs through
    killed = saved_state(experiment)  # what the resumed search starts from
    second = run_driver(script, storage, tmp / "plan.json", ray_session)
    try:
        _, err = second.communicate(timeout=TIMEOUT_S)
    finally:
        if second.poll() is None:
            kill_tree(second.pid, term_first=False)
    assert second.returncode == 0, err[-4000:]
    return killed, Plan.from_json(tmp / "plan.json")


def test_resumed_search_profiles_no_finished_candidate_again(killed_then_resumed):
    killed, plan = killed_then_resumed
    assert plan.meta["resumed"] is True
    rows = plan.profiles.set_index(["num_workers", "global_batch"])
    assert rows.index.is_unique  # every candidate profiled once
    expected = {(1, b) for b in BATCHES}
    assert set(rows.index) == expected and (rows["status"] == "ok").all()
    for row in killed["rows"].values():  # rows saved before the kill are kept as they were
        kept = rows.loc[(row["num_workers"], row["global_batch"])]
        assert kept["step_time_s"] == row["step_time_s"]
    done_before = {(r["num_workers"], r["global_batch"]) for r in killed["rows"].values()}
    later = plan.meta["sweeps"][len(killed["sweeps"]):]  # the worker groups after the kill
    assert later, "the resumed search launched nothing"
    # What the search cost counts both drivers' launches, and the first driver's probe.
    cost = plan.meta["search_cost"]
    assert sum(entry["launches"] for entry in cost["by_num_workers"]) == \
        len(plan.meta["sweeps"])
    assert plan.meta["probe_wall_s"] == 0 and cost["probe"]["seconds"] > 0
    for sweep in later:
        assert not {(sweep["num_workers"], b) for b in sweep["global_batches"]} & done_before


def test_resumed_search_makes_the_plan_of_its_rows(killed_then_resumed):
    """The same plan an uninterrupted search builds from the same rows and probe."""
    _, plan = killed_then_resumed
    sizes = tuple(sorted(plan.table["num_workers"].unique().tolist()))
    batches = tuple(sorted(plan.table["global_batch"].unique().tolist()))
    from tula_ray.space import SearchSpace

    again = build_plan(SearchSpace(sizes, batches), plan.profiles, epochs=plan.epochs,
                       dataset_size=plan.dataset_size, search_strategy=plan.search_strategy,
                       objective=plan.objective, pricing=plan.pricing, memory=plan.memory,
                       max_local_batch=plan.meta["max_local_batch"],
                       collective=plan.perf.collective, meta=plan.meta,
                       plain_steps=set(zip(plan.table.loc[plan.table["plain_steps"], "num_workers"],
                                           plan.table.loc[plan.table["plain_steps"],
                                                          "global_batch"])))
    assert again.choice == plan.choice
    columns = ["num_workers", "global_batch", "step_time_s", "total_time_s", "cost_usd",
               "feasible"]
    assert again.table[columns].equals(plan.table[columns])
    assert plan.meta["memory_probe"]  # the first driver's probe, restored, not rerun
