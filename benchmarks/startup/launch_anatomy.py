"""Where a launch's start goes (issue 40, item 4): the chain of processes Ray Tune and Ray
Train start before a worker group's function runs, read from Ray's own task events.

A search's launch is one Tune trial (its actor, `ImplicitFunc`), whose `fit()` starts Ray
Train's controller (`TrainController`); the controller starts the workers
(`RayTrainWorker`, with a placement-group cleaner and a synchronisation actor beside them),
sets up their train context (Ray Data's `DatasetManager` among it, with no dataset too),
then launches the function. Each actor's constructor is a task whose state changes Ray
records with their times (`ray.util.state.list_tasks(detail=True)`), so the start splits,
launch by launch, into:
  - trial actor: the trial actor's creation, from its first event to its constructor's end
    (before the trial's function starts: the demo's split counts it in Tune's time);
  - controller: the controller's creation, likewise;
  - workers: the controller's end to the last worker's constructor ending;
  - train context: to the last worker's train context set up;
  - function: to the function launched on the last worker.
`capture` reads the events while Ray is up (the demo's runner, before its shutdown);
`anatomy` is pure, so that it is tested on events made by hand.
"""

from __future__ import annotations

from typing import Any

PARTS = ("trial_actor_s", "controller_s", "workers_s", "train_context_s", "function_s")
TRIAL_ACTOR = "ImplicitFunc.__init__"
CONTROLLER = "TrainController.__init__"
WORKER = "RayTrainWorker.__init__"
CONTEXT = "RayTrainWorker.init_train_context"
FUNCTION = "RayTrainWorker.run_train_fn"
NAMES = (TRIAL_ACTOR, CONTROLLER, WORKER, CONTEXT, FUNCTION)
MAX_TASKS = 10_000  # the API server's own limit per call


def capture() -> list[dict[str, Any]]:
    """The task events of the chain's tasks in this driver's job (a driver joining a Ray
    that others used sees its own launches only): name, state, time (s), and the task's id
    (a task's events are grouped by it)."""
    import ray
    from ray.util.state import list_tasks

    job = ray.get_runtime_context().get_job_id()
    tasks = [task for name in NAMES
             for task in list_tasks(filters=[("name", "=", name), ("job_id", "=", job)],
                                    detail=True, limit=MAX_TASKS,
                                    raise_on_missing_output=False)]
    return [{"name": task["name"], "state": event["state"], "t": event["created_ms"] / 1e3,
             "task": task["task_id"]}
            for task in tasks for event in task.get("events") or []]


def anatomy(events: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per launch (a controller's creation, in time order), the parts the module's docstring
    names (seconds); a launch whose chain is incomplete in the events is left out."""
    spans = _spans(events)
    controllers = sorted((s for s in spans if s["name"] == CONTROLLER), key=lambda s: s["first"])
    trials = sorted((s for s in spans if s["name"] == TRIAL_ACTOR), key=lambda s: s["first"])
    launches = []
    for index, controller in enumerate(controllers):
        until = controllers[index + 1]["first"] if index + 1 < len(controllers) else float("inf")
        inside = [s for s in spans if controller["end"] <= s["first"] < until]
        trial = max((t for t in trials if t["end"] <= controller["first"]),
                    key=lambda t: t["end"], default=None)
        ends = {name: max((s["end"] for s in inside if s["name"] == name), default=None)
                for name in (WORKER, CONTEXT, FUNCTION)}
        if trial is None or None in ends.values():
            continue
        launches.append({
            "trial_actor_s": trial["end"] - trial["first"],
            "controller_s": controller["end"] - controller["first"],
            "workers_s": ends[WORKER] - controller["end"],
            "train_context_s": ends[CONTEXT] - ends[WORKER],
            "function_s": ends[FUNCTION] - ends[CONTEXT]})
    return launches


def _spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each task's first event and its FINISHED one (tasks that did not finish are left
    out)."""
    by_task: dict[str, dict[str, Any]] = {}
    for event in events:
        span = by_task.setdefault(event["task"], {"name": event["name"], "first": event["t"],
                                                  "end": None})
        span["first"] = min(span["first"], event["t"])
        if event["state"] == "FINISHED":
            span["end"] = event["t"]
    return [span for span in by_task.values() if span["end"] is not None]


def summed(launches: list[dict[str, float]]) -> dict[str, float]:
    """Each part summed over the launches (the demo's split sums its launches alike)."""
    return {f"launch_{part}": sum(launch[part] for launch in launches) for part in PARTS}
