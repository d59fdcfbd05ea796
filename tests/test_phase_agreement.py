"""Every phase of a profiled batch ends with the workers' agreement (issue 26, item 2), on
two gloo ranks without Ray (`tula_ray.training.profile_sweep` under a plain process
group): out of memory on one
rank in a later phase (the compute or synced steps, the strategy's second model) makes
the row "oom" with failure "oom" on both ranks, within seconds, instead of one rank
waiting in a collective for the process-group timeout and the row reading "error"; the
workload's own error and any other reach every rank with their class."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.common import spawn_gloo
from gloo_scenarios import run_scenarios
from tula_ray.failures import UserCodeError
from tula_ray.training.phase_agreement import (PeerFailureError, PeerOutOfMemoryError,
                                               PhaseAgreement)
from tula_ray.training.profile_settings import ProfileSettings
from tula_ray.training.profile_sweep import Sweep, SweepWorker, profile_batch
from tula_ray.workloads import Workload

GROUP_TIMEOUT_S = 30  # the process group's: a rank left waiting fails the test in 30 s
PROMPT_S = 10  # what "at once" means here: well under GROUP_TIMEOUT_S
FAILING_RANK = 1


class _Model(nn.Module):
    """A small classifier whose forward runs out of memory while `out_of_memory` is set."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        self.out_of_memory = False

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.out_of_memory:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.layers(inputs)


class _SecondModelRunsOut:
    """model_fn: the worker group's model, then (the strategy phase's second model) out of
    memory on FAILING_RANK."""

    def __init__(self, rank: int, fails: bool) -> None:
        self.rank, self.fails, self.calls = rank, fails, 0

    def __call__(self) -> nn.Module:
        self.calls += 1
        if self.fails and self.calls == 2 and self.rank == FAILING_RANK:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return _Model()


def _inject(sweep, rank: int, phase: str, when: str) -> None:
    """FAILING_RANK runs out of memory in `phase`: in its first step's forward ("forward":
    the compute steps, which take no collective), or after the phase's steps ("after": the
    synced steps' collectives done, then the last step's allocation fails)."""
    original = sweep.agreement.run

    def run(name, work, inside=None):
        if name != phase or rank != FAILING_RANK:
            return original(name, work, inside)

        def failing():
            if when == "forward":
                sweep.training.model.module.out_of_memory = True
            work()
            raise torch.OutOfMemoryError(f"CUDA out of memory in {name}")
        return original(name, failing, inside)

    sweep.agreement.run = run


def _profile_rank(rank: int, directory: str, phase: str, when: str) -> None:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 6, generator=generator),
                         torch.randint(0, 3, (256,), generator=generator))
    workload = Workload("mine-phases", model_fn=_SecondModelRunsOut(rank, when == "model_fn"),
                        train_dataset_fn=lambda: data, test_dataset_fn=lambda: data)
    settings = ProfileSettings(workload=workload, warmup_steps=2, measure_steps=2,
                               measure_seconds=0.05, training_strategy="lbt")
    sweep = Sweep(settings, SweepWorker.of_process_group(), first_batch=32)
    if phase and when != "model_fn":
        _inject(sweep, rank, phase, when)
    started = time.perf_counter()
    row = profile_batch(sweep, 32)
    with open(f"{directory}/{rank}.json", "w") as handle:
        json.dump({"status": row["status"], "failure": row["failure"], "error": row["error"],
                   "seconds": time.perf_counter() - started,
                   "phases": sweep.agreement.phases}, handle)


def _agreement_rank(rank: int, directory: str, error_kind: str) -> None:
    errors = {"user": ValueError("mat1 and mat2 shapes cannot be multiplied"),
              "infrastructure": ConnectionError("node lost")}
    agreement = PhaseAgreement("cpu")

    def work():
        if rank == FAILING_RANK:
            raise errors[error_kind]
        return "done"

    try:
        outcome = agreement.run("synced steps", work)
    except Exception as error:  # noqa: BLE001 - what each rank raised is the result
        outcome = type(error).__name__
    with open(f"{directory}/{rank}.txt", "w") as handle:
        handle.write(outcome)


OUT_OF_MEMORY_PHASES = [
    ("compute steps", "forward"),
    ("synced steps", "after"),
    ("strategy: second model", "model_fn"),  # the workload's model_fn itself runs out
]
ERROR_KINDS = [("user", UserCodeError.__name__), ("infrastructure", PeerFailureError.__name__)]
# Every test's scenario, (rank function, its arguments after the directory), the batch that
# profiles cleanly first: all run on one pair of gloo ranks, which import torch once, not
# once per test.
SCENARIOS = [(_profile_rank, "", ""), *((_profile_rank, *case) for case in OUT_OF_MEMORY_PHASES),
             *((_agreement_rank, kind) for kind, _ in ERROR_KINDS)]


def _every_scenario_rank(rank: int, directory: str) -> None:
    run_scenarios(rank, directory, SCENARIOS)


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("phase-agreement")
    for index in range(len(SCENARIOS)):
        (directory / str(index)).mkdir()
    spawn_gloo(_every_scenario_rank, 2, str(directory), timeout_s=GROUP_TIMEOUT_S)
    return directory


def _outcome(scenarios: Path, scenario: tuple, suffix: str) -> dict[int, str]:
    """What each rank wrote in `scenario`."""
    directory = scenarios / str(SCENARIOS.index(scenario))
    return {rank: (directory / f"{rank}.{suffix}").read_text() for rank in (0, 1)}


def _rows(scenarios: Path, phase: str, when: str) -> dict[int, dict]:
    return {rank: json.loads(text) for rank, text in
            _outcome(scenarios, (_profile_rank, phase, when), "json").items()}


@pytest.mark.parametrize("phase, when", OUT_OF_MEMORY_PHASES)
def test_out_of_memory_on_one_rank_in_a_later_phase_is_oom_on_every_rank_at_once(
        scenarios, phase, when):
    rows = _rows(scenarios, phase, when)
    for rank, row in rows.items():
        assert (row["status"], row["failure"]) == ("oom", "oom"), (rank, row)
        assert row["seconds"] < PROMPT_S, (rank, row)
        assert row["phases"][-1] == phase  # both stopped at the same point
    assert rows[FAILING_RANK]["error"].startswith("OutOfMemoryError")
    assert rows[1 - FAILING_RANK]["error"].startswith(PeerOutOfMemoryError.__name__)
    assert f"worker {FAILING_RANK} failed in the {phase} phase" in rows[1 - FAILING_RANK]["error"]


def test_every_phase_of_a_batch_ends_with_the_agreement(scenarios):
    rows = _rows(scenarios, "", "")
    assert rows[0]["status"] == rows[1]["status"] == "ok"
    assert rows[0]["phases"] == rows[1]["phases"]
    assert set(rows[0]["phases"]) == {
        "first step", "memory step", "warm-up", "first synced steps", "compute steps",
        "synced steps", "gradient noise", "checkpoint", "evaluation",
        "strategy: first plain step", "strategy: plain steps", "strategy: second model",
        "strategy: setup", "strategy: first step", "strategy: steps"}


@pytest.mark.parametrize("error_kind, peer_raises", ERROR_KINDS)
def test_any_failure_reaches_every_rank_with_its_class(scenarios, error_kind, peer_raises):
    outcomes = _outcome(scenarios, (_agreement_rank, error_kind), "txt")
    assert outcomes[FAILING_RANK] in ("ValueError", "ConnectionError")  # its own error
    assert outcomes[1 - FAILING_RANK] == peer_raises
