"""An entry point's Ray lifetime, the one skeleton `search`, `train` and `tune_training` share.

Ray-facing. Ray started or joined for the run, the run's workers provisioned (asked of the
autoscaler when needed), the storage path checked from every node; on the way out, the
autoscaler request released and a Ray this run started shut down, whatever happened.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from tula_ray.cluster.session import ray_session
from tula_ray.cluster.storage import check_storage_path
from tula_ray.cluster.workers import (PROVISION_TIMEOUT_S_DEFAULT, Workers, provision_workers,
                                      release_workers)
from tula_ray.verbosity import VERBOSE_DEFAULT


@contextlib.contextmanager
def cluster_for_run(num_workers: int, resources_per_worker: dict[str, float] | None = None, *,
                    address: str | None = None, runtime_env: dict[str, Any] | None = None,
                    use_gpu: bool | None = None, storage_path: str | None = None,
                    timeout_s: float = PROVISION_TIMEOUT_S_DEFAULT,
                    verbose: int = VERBOSE_DEFAULT,
                    first_workers: int | None = None) -> Iterator[Workers]:
    """Yield the `Workers` of a run of at most `num_workers` workers (see
    `provision_workers`), on a Ray joined or started for the block (`ray_session`, which
    prints as `verbose` says), with `storage_path` checked (`check_storage_path`).

    first_workers: how many to provision now (default `num_workers`), for a run that
    provisions each later phase itself (the search's rounds, smallest N first); the
    cluster is checked up front to hold `num_workers` in any case."""
    with ray_session(address, runtime_env, verbose):
        workers = provision_workers(first_workers or num_workers, resources_per_worker,
                                    use_gpu=use_gpu, timeout_s=timeout_s,
                                    most_workers=num_workers)
        try:
            check_storage_path(storage_path)
            yield workers
        finally:
            release_workers(workers)
