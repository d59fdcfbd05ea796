"""The core never imports Ray: it must stay usable (and testable) without a cluster."""

import subprocess
import sys
from pathlib import Path

import tula_ray

# The Ray-facing modules of the package (DESIGN "Layers"): the entry points and the one
# module for cluster concerns. Every other module of tula_ray/ is core: a new module is
# checked without being listed here.
RAY_FACING = {"__init__", "search", "search_experiment", "train", "cli", "cluster",
              "tune_training"}
CORE = sorted(path.stem for path in Path(tula_ray.__file__).parent.glob("*.py")
              if path.stem not in RAY_FACING)


def test_core_modules_do_not_import_ray():
    # One fresh interpreter imports the core modules one by one and names the
    # first after which ray is loaded (a subprocess each would cost ~4 s apiece).
    code = (
        "import importlib, sys\n"
        f"for name in {CORE!r}:\n"
        "    importlib.import_module('tula_ray.' + name)\n"
        "    if any(m == 'ray' or m.startswith('ray.') for m in sys.modules):\n"
        "        sys.exit('tula_ray.' + name + ' imported ray')\n"
        "import tula_ray\n"
        "sys.exit('tula_ray imported ray' if 'ray' in sys.modules else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_core_list_covers_the_models_and_ags():
    assert {"space", "perf", "memory", "pricing", "policy", "plan", "ags", "arguments"} <= set(CORE)


def test_the_check_itself_sees_ray():
    """Guard against a check that cannot fail: the Ray-facing searcher does load ray."""
    code = "import sys, searchers; sys.exit(0 if 'ray' in sys.modules else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_entry_points_stay_functions_and_never_import_each_other():
    """`tula_ray.search` / `tula_ray.train` are functions even after their modules (same
    names) are imported; the search entry and the training entry are independent."""
    code = (
        "import sys\n"
        "from tula_ray.search import search as search_fn\n"
        "assert 'tula_ray.train' not in sys.modules, 'the search entry imported tula_ray.train'\n"
        "import tula_ray\n"
        "assert tula_ray.search is search_fn, tula_ray.search\n"
        "del sys.modules['tula_ray.search']\n"
        "from tula_ray.train import train as train_fn\n"
        "assert 'tula_ray.search' not in sys.modules, 'the training entry imported tula_ray.search'\n"
        "assert tula_ray.train is train_fn, tula_ray.train\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
