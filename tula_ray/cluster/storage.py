"""Storage every node reaches and may write: a multi-node run needs one, and a cloud URI
must be writable from every node (Ray-facing).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

# What to do when a node may not write a cloud URI (AWS: the worker's instance profile).
URI_FIX = ("give every node's credentials read and write on it (on AWS, the nodes' instance "
           "profile: deploy/aws/bucket-policy.json and docs/guide/cluster.md, 'IAM roles')")

# ------------------------------------------------------------------ storage

def check_storage_path(storage_path: str | None, filesystem: Any = None) -> None:
    """Refuse a multi-node cluster without a storage path every node reaches, and a cloud
    URI that a node may not write.

    Ray Train keeps a run's storage under `storage_path` (default ~/ray_results on the
    driver's node); rank 0 on another node cannot find a local one and the run fails at
    its first checkpoint. A local path is checked from every node (a marker file the
    driver writes must be visible to each). A cloud URI is written and read back from a
    task on every node, through pyarrow's file systems as Ray Train writes it
    (`filesystem`: a pyarrow FileSystem to use instead of the URI's, as Ray's
    `RunConfig(storage_filesystem=)`): a node without rights fails here, named, not at its
    first checkpoint, three times over.
    """
    nodes = [node for node in ray.nodes() if node["Alive"]]
    if storage_path is not None and "://" in storage_path:  # file:// too: pyarrow's
        _check_writable(storage_path, nodes, filesystem)
        if not storage_path.startswith("file://"):
            return
    if len(nodes) < 2:
        return
    fix = ("pass storage_path= a directory every node mounts (a shared file system such "
           "as NFS, e.g. '/mnt/shared/tula') or a cloud URI (e.g. 's3://bucket/tula')")
    if storage_path is None:
        raise ValueError(f"this Ray cluster has {len(nodes)} nodes and storage_path is None: "
                         "Ray would keep the run's files on the driver's node, where workers "
                         f"on the other nodes cannot reach them; {fix}")
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


def _check_writable(uri: str, nodes: list[dict], filesystem: Any = None) -> None:
    """Raises ValueError naming the nodes that cannot write and read back `uri`."""
    failed = nodes_not_writing(uri, nodes, filesystem)
    if failed:
        why = "; ".join(f"{address}: {error}" for address, error in failed.items())
        raise ValueError(f"storage_path={uri!r} cannot be written from the nodes at "
                         f"{', '.join(failed)} ({why}); {URI_FIX}")


def nodes_not_writing(uri: str, nodes: list[dict], filesystem: Any = None) -> dict[str, str]:
    """{address: error} of the nodes where a task cannot write a marker under `uri` and
    read it back (through pyarrow's file system of the URI, or `filesystem`)."""
    probe = ray.remote(num_cpus=0)(write_and_read)
    errors = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node["NodeID"], soft=False)).remote(uri, filesystem) for node in nodes])
    return {node["NodeManagerAddress"]: error for node, error in zip(nodes, errors) if error}


def write_and_read(uri: str, filesystem: Any = None) -> str | None:
    """Writes a marker under `uri`, reads it back and deletes it; the error, else None."""
    import pyarrow.fs

    try:
        if filesystem is None:
            filesystem, path = pyarrow.fs.FileSystem.from_uri(uri)
        else:
            path = uri.split("://", 1)[-1]
        marker = f"{path.rstrip('/')}/.tula-ray-storage-check-{uuid.uuid4().hex}"
        filesystem.create_dir(path, recursive=True)
        written = b"written by a tula-ray storage check; removed after it\n"
        with filesystem.open_output_stream(marker) as stream:
            stream.write(written)
        with filesystem.open_input_stream(marker) as stream:
            read = stream.read()
        filesystem.delete_file(marker)
    except Exception as error:  # every refusal of a store is its own class: name it
        return f"{type(error).__name__}: {error}"
    return None if read == written else "the marker read back differs from what was written"
