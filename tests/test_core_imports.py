"""The core never imports Ray: it must stay usable (and testable) without a cluster."""

import subprocess
import sys

CORE = ["space", "profiles", "perf", "memory", "pricing", "policy", "plan", "plotting",
        "synthetic", "datasets", "workloads", "measure", "ags", "strategies", "training"]


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


def test_the_check_itself_sees_ray():
    """Guard against a check that cannot fail: the Ray-facing searcher does load ray."""
    code = "import sys, searchers; sys.exit(0 if 'ray' in sys.modules else 1)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
