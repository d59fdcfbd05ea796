"""`tula-ray demo`, timed from the inside: run as a script with a source tree first on
PYTHONPATH (this tree or an older commit's), it times what the demo's plan does not record
(Ray's start and end, planning, the plan's output) and writes them to OUT/startup.json.

    python benchmarks/startup/demo_startup_runner.py OUT DEMO_ARGS...

Only names both trees have are wrapped: `ray.init`, `ray.shutdown`, the search entry's
`build_plan` and the command's `write_plan`; nothing else of the demo changes. Before Ray
shuts down, its task events give each launch's start in parts (`launch_anatomy.py`, loaded
from beside this file: an older tree has none); the time that takes is recorded apart
(`anatomy_capture_s`), for the benchmark to leave out of the wall.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()


def _timed(owner, name: str, key: str, seconds: dict[str, float]) -> None:
    """Replace owner.name by a wrapper that adds its wall time to seconds[key]."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began

    setattr(owner, name, wrapper)


def _capturing_anatomy(ray, seconds: dict[str, float], anatomy: dict[str, Any]) -> None:
    """Wrap ray.shutdown so that the first call reads the launches' anatomy first."""
    spec = importlib.util.spec_from_file_location(
        "launch_anatomy", Path(__file__).with_name("launch_anatomy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    original = ray.shutdown

    def shutdown(*args, **kwargs):
        if ray.is_initialized() and "launches" not in anatomy:
            began = time.perf_counter()
            anatomy["launches"] = module.anatomy(module.capture())
            seconds["anatomy_capture_s"] = time.perf_counter() - began
        return original(*args, **kwargs)

    ray.shutdown = shutdown


def main() -> int:
    out, demo_args = Path(sys.argv[1]), sys.argv[2:]
    seconds: dict[str, float] = {}
    import ray  # noqa: E402 - timed from here on: the command's own imports follow

    from tula_ray.cli import commands, main as cli_main
    from tula_ray.runs import search

    seconds["imports_s"] = time.perf_counter() - STARTED
    _timed(ray, "init", "ray_start_s", seconds)
    _timed(ray, "shutdown", "ray_end_s", seconds)
    anatomy: dict[str, Any] = {}
    _capturing_anatomy(ray, seconds, anatomy)  # outside ray_end_s: its own time is apart
    _timed(search, "build_plan", "planning_s", seconds)
    _timed(commands, "write_plan", "output_s", seconds)
    code = cli_main(["demo", "--out", str(out), *demo_args])
    seconds["total_s"] = time.perf_counter() - STARTED
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.json").write_text(json.dumps({**seconds, **anatomy}))
    return code


if __name__ == "__main__":
    sys.exit(main())
