"""A griffe extension: every name of `tula_ray.__all__`, documented by its public name.

`tula_ray` loads its entry points lazily (`tula_ray.__getattr__`: `search`, `train`,
`Workload`, ... import Ray or torch), so reading the source alone, griffe does not see
them in the package. For each public name it lacks, this imports the object and adds an
alias `tula_ray.NAME` to where the object is defined, so `::: tula_ray.search` in a page
documents `tula_ray.search` wherever its module moves.
"""

from __future__ import annotations

import importlib
from typing import Any

import griffe

PACKAGE = "tula_ray"


class PublicNames(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != PACKAGE:
            return
        package = importlib.import_module(PACKAGE)
        for name in package.__all__:
            if name in pkg.members:
                continue
            obj = getattr(package, name)
            target = f"{obj.__module__}.{obj.__qualname__}"
            pkg.set_member(name, griffe.Alias(name, target, parent=pkg))
