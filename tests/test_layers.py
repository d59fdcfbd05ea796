"""The code keeps to its layers (tests/layers.py) and has no import cycle, read from the
syntax tree: imports inside functions count (a hidden runtime loop is still a loop)."""

from __future__ import annotations

import ast
import functools

import pytest

from layers import (LAYERS, NOT_FOR_BENCHMARKS, modules, place, private_imports,
                    project_imports)

MAX_MODULE_LINES = 400

KNOWN = modules()


@functools.cache  # the tree does not change during a run: parsed once, not once per module
def _edges() -> dict[str, set[str]]:
    graph = {}
    for module, path in KNOWN.items():
        targets = project_imports(path, module, KNOWN)
        if path.name == "__init__.py":  # a package's face re-exports its own submodules
            targets = {t for t in targets if not t.startswith(module + ".")}
        graph[module] = targets
    return graph


def test_every_module_is_in_a_layer():
    for module in KNOWN:
        place(module)  # raises, naming the module, when none fits


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_imports_flow_downwards(module):
    layer, group = place(module)
    for target in _edges()[module]:
        target_layer, target_group = place(target)
        upward = target_layer < layer
        sideways = target_layer == layer and target_group != group
        assert not (upward or sideways), (
            f"{module} ({LAYERS[layer][0]}) imports {target} ({LAYERS[target_layer][0]}): "
            "imports flow downwards only, and the groups of a layer stay independent")


@pytest.mark.parametrize("module", sorted(m for m in KNOWN if m.startswith("benchmarks")))
def test_benchmarks_measure_through_the_public_api(module):
    adapters = {t for t in _edges()[module] if t.split(".")[0] in NOT_FOR_BENCHMARKS}
    assert not adapters, (f"{module} imports {sorted(adapters)}: a benchmark goes through "
                          "tula_ray (its API and subpackages), not the Ray adapters")


def test_no_import_cycle():
    graph = _edges()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                loop = path[path.index(target):] + [target] if target in path else [node, target]
                raise AssertionError("import cycle: " + " -> ".join(loop))
            if target not in state:
                visit(target, path + [target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_module_is_too_long():
    long = {m: n for m, p in KNOWN.items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split where the concerns part): {long}"


def test_submodules_import_their_siblings_not_their_package_face():
    """Inside a subpackage, a module imports the sibling that defines a name, never the
    package's __init__, which imports the submodules (a loop at import time)."""
    for module, path in KNOWN.items():
        package = module.rpartition(".")[0]
        if path.name == "__init__.py" or package in ("", "tula_ray"):
            continue
        tree = ast.parse(path.read_text())
        faces = [n.lineno for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module == package and not n.level]
        assert not faces, f"{module} imports its own package face {package} (line {faces[0]})"


def test_the_check_sees_a_violation():
    """Guard against a check that cannot fail: the core importing the entry points is upward."""
    core, entry = place("tula_ray.planning.plan"), place("tula_ray.runs.search")
    assert entry[0] < core[0]
    assert place("searchers.tula_searcher")[0] == place("trainables.profiling_loop")[0]
    assert place("searchers.tula_searcher")[1] != place("trainables.profiling_loop")[1]
    # benchmarks on top, their kinds side by side over what they share
    assert place("benchmarks.prediction.replay")[0] < place("tula_ray.cli")[0]
    assert place("benchmarks.startup.demo_startup")[0] < place("benchmarks.prediction.replay")[0]
    training, accuracy = place("benchmarks.training.tuning"), place("benchmarks.accuracy.replay")
    assert training[0] == accuracy[0] and training[1] != accuracy[1]
    assert place("benchmarks.common.results")[0] > training[0]


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_no_module_imports_another_modules_private_name(module):
    """A name with a leading underscore is its module's own: another module that needs it
    needs a public name (issue 42, step 5)."""
    path = KNOWN[module]
    found = private_imports(path.read_text(), module, KNOWN, path.name == "__init__.py")
    assert not found, (f"{module} uses another module's private name ({'; '.join(found)}): "
                       "give the name a public spelling in its module, and use that")


def test_the_private_name_check_sees_a_violation():
    """Guard against a check that cannot fail: each form it looks for, and what it lets be."""
    known = {"pkg", "pkg.a", "pkg.b"}

    def found(source: str, module: str = "pkg.b") -> list[str]:
        return private_imports(source, module, known)

    assert found("from pkg.a import _hidden\n") == ["line 1: from pkg.a import _hidden"]
    assert found("from .a import public, _hidden\n") == ["line 1: from pkg.a import _hidden"]
    assert found("import pkg.a\npkg.a._hidden()\n") == ["line 2: pkg.a._hidden"]
    assert found("import pkg.a as a\na._hidden\n") == ["line 2: pkg.a._hidden"]
    assert found("from pkg import a\nx = a._hidden\n") == ["line 2: pkg.a._hidden"]
    assert not found("from pkg.a import public, __version__\nimport ray\nray._private\n")
    assert not found("def f(self):\n    return self._own\n_mine = 1\nprint(_mine)\n")
    assert not found("from pkg.b import _mine\n")  # its own name, however it spells it
