"""Storage every node reaches: a multi-node run needs one (Ray-facing).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

# ------------------------------------------------------------------ storage

def check_storage_path(storage_path: str | None) -> None:
    """Refuse a multi-node cluster without a storage path every node reaches.

    Ray Train keeps a run's storage under `storage_path` (default ~/ray_results on the
    driver's node); rank 0 on another node cannot find a local one and the run fails at
    its first checkpoint. Cloud URIs are taken as they are; a local path is checked
    from every node (a marker file the driver writes must be visible to each).
    """
    nodes = [node for node in ray.nodes() if node["Alive"]]
    if len(nodes) < 2:
        return
    fix = ("pass storage_path= a directory every node mounts (a shared file system such "
           "as NFS, e.g. '/mnt/shared/tula') or a cloud URI (e.g. 's3://bucket/tula')")
    if storage_path is None:
        raise ValueError(f"this Ray cluster has {len(nodes)} nodes and storage_path is None: "
                         "Ray would keep the run's files on the driver's node, where workers "
                         f"on the other nodes cannot reach them; {fix}")
    if "://" in storage_path and not storage_path.startswith("file://"):
        return  # a cloud URI: every node reaches it through pyarrow's file systems
    missing = nodes_not_seeing(Path(storage_path.removeprefix("file://")).expanduser(), nodes)
    if missing:
        raise ValueError(f"storage_path={storage_path!r} is not visible from the nodes at "
                         f"{', '.join(missing)} (a file written there by the driver is not "
                         f"found on them); {fix}")


def nodes_not_seeing(directory: Path, nodes: list[dict]) -> list[str]:
    """Addresses of the nodes where a marker file the driver writes in `directory` is absent."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f".tula-ray-storage-check-{uuid.uuid4().hex}"
    marker.write_text("written by the driver; removed after the check\n")
    try:
        exists = ray.remote(num_cpus=0)(os.path.exists)
        seen = ray.get([exists.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node["NodeID"], soft=False)).remote(str(marker.resolve())) for node in nodes])
    finally:
        marker.unlink(missing_ok=True)
    return [node["NodeManagerAddress"] for node, found in zip(nodes, seen) if not found]
