"""`tula-ray --import`: a user's extension modules, imported before the command runs.

A module registers what it adds (`tula_ray.register_search_strategy`, ...) when it is
imported; the command then knows it by name, as it knows the built-ins. Each module is also
marked to travel to Ray workers by value (Ray's cloudpickle), so that the workloads and
training strategies it defines reach workers that cannot import it (another node, another
working directory).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_extension(spec: str) -> ModuleType:
    """The module `spec` names: a path to a .py file (imported under its file name), or a
    dotted module name (looked up from the working directory too, as `python -m` does)."""
    if spec.endswith(".py"):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{spec!r} is not a file; give a .py file or a module name")
        name = path.stem
        loaded = sys.modules.get(name)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded  # imported already: its registrations stand
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(spec)


def import_extensions(specs: list[str]) -> list[ModuleType]:
    """Import every module `specs` names, in order, and send each to Ray workers by value."""
    modules = [import_extension(spec) for spec in specs]
    if modules:
        from ray import cloudpickle  # Ray serialises with its own copy of cloudpickle

        for module in modules:
            cloudpickle.register_pickle_by_value(module)
    return modules
