"""A launch's start in parts, from Ray's task events (benchmarks/startup/launch_anatomy.py),
on events made by hand: no Ray. (Read from a real Ray by the demo-startup smoke test in
tests/test_cli_ray.py.)"""

import pytest

from benchmarks.startup.launch_anatomy import (CONTEXT, CONTROLLER, FUNCTION, PARTS,
                                               TRIAL_ACTOR, WORKER, anatomy, summed)


def _task(task: str, name: str, first: float, end: float | None) -> list[dict]:
    events = [{"task": task, "name": name, "state": "PENDING_NODE_ASSIGNMENT", "t": first},
              {"task": task, "name": name, "state": "RUNNING", "t": (first + (end or first)) / 2}]
    if end is not None:
        events.append({"task": task, "name": name, "state": "FINISHED", "t": end})
    return events


def _launch(at: float, workers: int = 2) -> list[dict]:
    """A launch starting at `at`: trial actor 2 s, controller 3 s, workers up 2.5 s after it,
    their context 1.5 s later, the function 0.25 s after that (the last worker's, each)."""
    events = _task(f"trial{at}", TRIAL_ACTOR, at, at + 2) + \
        _task(f"controller{at}", CONTROLLER, at + 2.1, at + 5.1)
    for rank in range(workers):
        late = 0.1 * rank  # the last worker sets each part's end
        events += _task(f"worker{at}-{rank}", WORKER, at + 5.2, at + 7.5 + late)
        events += _task(f"context{at}-{rank}", CONTEXT, at + 7.7 + late, at + 9.0 + late)
        events += _task(f"function{at}-{rank}", FUNCTION, at + 9.1 + late, at + 9.25 + late)
    return events


def test_each_launch_splits_into_the_chains_parts():
    events = _launch(100.0) + _launch(200.0, workers=1)
    first, second = anatomy(list(reversed(events)))  # the order of the events is not used
    assert first == pytest.approx({"trial_actor_s": 2.0, "controller_s": 3.0,
                                   "workers_s": 2.5, "train_context_s": 1.5,
                                   "function_s": 0.25})
    assert second["workers_s"] == pytest.approx(2.4)  # its one worker, 0.1 s sooner
    assert summed([first, second])["launch_controller_s"] == pytest.approx(6.0)
    assert set(summed([first])) == {f"launch_{part}" for part in PARTS}


def test_a_launch_whose_chain_did_not_finish_is_left_out():
    unfinished = [e for e in _launch(300.0) if not (e["name"] == FUNCTION
                                                    and e["state"] == "FINISHED")]
    assert len(anatomy(_launch(100.0) + unfinished)) == 1
    # a controller with no trial actor before it (another driver's) is not a launch either
    assert anatomy([e for e in _launch(100.0) if e["name"] != TRIAL_ACTOR]) == []
