"""The core never imports Ray: it must stay usable (and testable) without a cluster."""

import subprocess
import sys

from layers import CORE_LAYERS, LAYERS, modules, place

# Every module of tula_ray/, in subpackages too, whose layer is core (tests/layers.py): a
# new or moved module is checked without being listed here.
CORE = sorted(m for m in modules() if m.startswith("tula_ray")
              and LAYERS[place(m)[0]][0] in CORE_LAYERS)


def test_core_modules_do_not_import_ray():
    # One fresh interpreter imports the core modules one by one and names the
    # first after which ray is loaded (a subprocess each would cost ~4 s apiece).
    code = (
        "import importlib, sys\n"
        f"for name in {CORE!r}:\n"
        "    importlib.import_module(name)\n"
        "    if any(m == 'ray' or m.startswith('ray.') for m in sys.modules):\n"
        "        sys.exit(name + ' imported ray')\n"
        "import tula_ray\n"
        "sys.exit('tula_ray imported ray' if 'ray' in sys.modules else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_core_list_covers_the_subpackages():
    for name in ("tula_ray.space", "tula_ray.models.perf", "tula_ray.models.memory",
                 "tula_ray.models.pricing", "tula_ray.planning.policy", "tula_ray.planning.plan",
                 "tula_ray.ags.optimizer", "tula_ray.training.run", "tula_ray.workloads.check",
                 "tula_ray.arguments"):
        assert name in CORE, name
    assert not any(m.startswith(("tula_ray.runs", "tula_ray.cluster", "tula_ray.cli"))
                   for m in CORE)


def test_the_check_itself_sees_ray():
    """Guard against a check that cannot fail: the Ray-facing searcher does load ray."""
    code = "import sys, searchers; sys.exit(0 if 'ray' in sys.modules else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_entry_points_are_functions_and_never_import_each_other():
    """`tula_ray.search` / `tula_ray.train` are the functions, whatever was imported
    before; the search entry and the training entry are independent."""
    code = (
        "import sys\n"
        "from tula_ray.runs.search import search as search_fn\n"
        "assert 'tula_ray.runs.train' not in sys.modules, 'the search entry imported train'\n"
        "import tula_ray\n"
        "assert tula_ray.search is search_fn, tula_ray.search\n"
        "del sys.modules['tula_ray.runs.search']\n"
        "from tula_ray.runs.train import train as train_fn\n"
        "assert 'tula_ray.runs.search' not in sys.modules, 'the training entry imported search'\n"
        "assert tula_ray.train is train_fn, tula_ray.train\n"
        "import tula_ray.runs.tune_training\n"
        "assert callable(tula_ray.tune_training) and tula_ray.Workload.__name__ == 'Workload'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
