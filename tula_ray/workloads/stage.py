"""Stage the built-in workloads' data on this machine: `python3 -m tula_ray.workloads.stage`.

Run once per node before any training (cluster.yaml's worker setup does): Fashion-MNIST is
fetched into the cache and both splits are decoded there, so the ranks that start later
read them instead of each fetching at their first step. Without it a run is still safe,
only slower to start: `fashion_mnist_files.locate` lets one process per machine download
while the others wait. FakeData needs nothing staged (it is generated in memory).
"""

from __future__ import annotations

import argparse
import logging
import sys

from tula_ray.workloads.datasets import fashion_mnist
from tula_ray.workloads.fashion_mnist_files import locate


def stage(root: str | None = None) -> str:
    """Fashion-MNIST located (downloaded if needed) and both splits decoded into the cache;
    returns where the files came from. FileNotFoundError says what to do when no source
    works."""
    located = locate(root)
    for train in (True, False):
        fashion_mnist(train, root=str(located.root))
    return located.source


def main(argv: list[str] | None = None) -> int:
    """Command line: exit status 0 when the data are staged, 1 (and why) when not."""
    parser = argparse.ArgumentParser(prog="python3 -m tula_ray.workloads.stage",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None,
                        help="a directory holding Fashion-MNIST (default: $TULA_DATA_DIR, "
                             "Debian's package, the cache, else a download)")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        source = stage(arguments.root)
    except (FileNotFoundError, TimeoutError) as exc:
        print(f"Fashion-MNIST not staged: {exc}", file=sys.stderr)
        return 1
    print(f"Fashion-MNIST staged: {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
