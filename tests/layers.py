"""The layers of the code (DESIGN "Layers"), declared once: imports flow downwards only.

Each layer is a list of groups; a group is a list of module prefixes. A module may import
modules of its own group and of any lower layer. Groups of one layer are independent: they
never import each other (the search entry and the training entry, searchers/ and
trainables/, ...). Every module of the import packages and of benchmarks/ must fall in
exactly one group.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("tula_ray", "searchers", "trainables", "benchmarks")

# Top first. The package face `tula_ray` (its __init__) re-exports from the core and loads
# the entry points lazily by name, so it belongs with the core's vocabulary.
LAYERS: list[tuple[str, list[list[str]]]] = [
    # benchmarks/ on top: `python -m benchmarks`, then the benchmarks that time the demo or a
    # search run as a user runs it (start-up over the search's cost), then the kinds of
    # benchmark, each on its own, then what they share.
    ("benchmarks' command", [["benchmarks", "benchmarks.__main__"]]),
    ("benchmarks of whole runs", [["benchmarks.startup"], ["benchmarks.gpu"]]),
    ("benchmarks", [["benchmarks.prediction"], ["benchmarks.training"],
                    ["benchmarks.accuracy"]]),
    ("benchmarks' common", [["benchmarks.common"]]),
    ("command", [["tula_ray.cli"]]),
    ("entry points", [["tula_ray.runs.search", "tula_ray.runs.search_experiment",
                       "tula_ray.runs.search_request"],
                      ["tula_ray.runs.train", "tula_ray.runs.adaptive_batch",
                       "tula_ray.runs.tune_training", "tula_ray.runs.training_job"],
                      ["tula_ray.runs"]]),
    ("ray-facing adapters", [["searchers"], ["trainables"]]),
    ("cluster", [["tula_ray.cluster"]]),
    ("planning and training", [["tula_ray.planning"], ["tula_ray.training"]]),
    ("models, workloads, ags", [["tula_ray.models"], ["tula_ray.workloads"], ["tula_ray.ags"]]),
    ("vocabulary", [["tula_ray.space", "tula_ray.profile_table", "tula_ray.failures",
                     "tula_ray.arguments", "tula_ray.distributed", "tula_ray.precision",
                     "tula_ray.verbosity", "tula_ray.evaluation_schedule", "tula_ray"]]),
]
# The Ray-facing adapters are the product's insides: benchmarks measure it through the
# public tula_ray API and its subpackages, never through these.
NOT_FOR_BENCHMARKS = ("searchers", "trainables")
# Layers whose modules never import ray (DESIGN: the core is tested without a cluster).
CORE_LAYERS = ("planning and training", "models, workloads, ags", "vocabulary")


def modules() -> dict[str, Path]:
    """Every module of the import packages: dotted name -> file."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or (prefix != "tula_ray" and module.startswith(prefix + "."))


def place(module: str) -> tuple[int, int]:
    """(layer index, group index) of `module`: the most specific prefix wins."""
    best: tuple[int, int, int] | None = None
    for layer, (_, groups) in enumerate(LAYERS):
        for group, prefixes in enumerate(groups):
            for prefix in prefixes:
                if _matches(module, prefix) and (best is None or len(prefix) > best[2]):
                    best = (layer, group, len(prefix))
    if best is None:
        raise LookupError(f"module {module} is in no layer of tests/layers.py")
    return best[0], best[1]


def imports(path: Path, module: str) -> set[str]:
    """Modules (of any package) that `path` imports, function-level imports included and
    `if TYPE_CHECKING:` blocks excluded; relative imports resolved."""
    tree = ast.parse(path.read_text())
    skipped = {id(node) for block in ast.walk(tree)
               if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
               for node in ast.walk(block)}
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def project_imports(path: Path, module: str, known: dict[str, Path]) -> set[str]:
    """The project's modules that `module` imports (a name imported from a module counts
    as that module)."""
    result = set()
    for name in imports(path, module):
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            result.add(name)
    return result


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _resolved(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of a `from ... import`, relative imports resolved."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([base] if base else []))


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` of a chain of attributes over a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def private_imports(source: str, module: str, known: dict[str, Path] | set[str],
                    is_package: bool = False) -> list[str]:
    """Where `source` (the module `module`) reaches another project module's private name
    (`_name`, not `__dunder__`): `from x import _name`, or `x._name` of a module it
    imported (`import x`, `import a.x as x`, `from a import x`). One line per finding,
    "line N: x._name"; a module's own private names are its business, and other
    packages' (ray._private, ...) are not the project's to rename."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # a local name -> the project module it names
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    bound[alias.asname] = alias.name
                elif not alias.asname:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _resolved(node, module, is_package)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:  # a submodule imported by name
                    bound[alias.asname or alias.name] = target
                elif base in known and base != module and _is_private(alias.name):
                    found.append(f"line {node.lineno}: from {base} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            dotted = _dotted(node.value)
            if dotted is None or dotted.split(".")[0] not in bound:
                continue
            head, _, rest = dotted.partition(".")
            target = ".".join(filter(None, [bound[head], rest]))
            if target in known and target != module:
                found.append(f"line {node.lineno}: {target}.{node.attr}")
    return found
