"""Starting or joining Ray, for the length of an entry point's run.

Ray-facing (imports ray); the search entry (`tula_ray.search`), the training entry
(`tula_ray.train`) and the trainables take these from here, never from each other.

Joining: `ensure_ray(address)` joins the Ray cluster the user names (an address, "auto"
for the cluster this machine belongs to, or the RAY_ADDRESS environment variable, which
`ray job submit` sets for a submitted driver). Nothing named: a new local Ray that keeps
everything on loopback (`start_local_ray`), so a search on a laptop exposes nothing to
the network; but not beside a Ray that `ray start` runs on this machine (a cluster head):
that is refused at once (`refuse_a_second_ray`), since a second, separate Ray would read
the head's autoscaler config and wait for nodes that never join it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import os
import socket
from typing import Any, Iterator

import ray

from tula_ray.training.host_allocator import check_setting as check_host_allocator
from tula_ray.verbosity import VERBOSE_DEFAULT, ray_log_level, show

logger = logging.getLogger(__name__)

# The local default binds every Ray server to this address. Ray's core servers (GCS,
# raylet, workers) listen on ALL interfaces unless their node address is exactly
# 127.0.0.1, and Ray rewrites 127.0.0.1 to the external address unless its local-only
# switch is on (measured with Ray 2.60: see `start_local_ray`).
LOCAL_NODE_IP = "127.0.0.1"
ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable; `ray job submit` sets it for the driver
LOCAL_ADDRESS = "local"  # ray.init's word for "a new local Ray"
# Ray's switch for a Ray that stays on one machine (read by ray_constants at import,
# and by every Ray process it starts): node address 127.0.0.1, not rewritten.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Custom resource a Tune trial's driver holds instead of a CPU; `ray.init(resources=
# {DRIVER_RESOURCE: k})` allows k concurrent trials. Cluster nodes declare it in cluster.yaml.
DRIVER_RESOURCE = "train_driver"
DRIVER_SLOTS_DEFAULT = 4  # trial drivers a local Ray offers (trials run one at a time anyway)
# How long a Ray recorded by `ray start` may take to accept a connection before the record
# is taken as stale (a Ray that died without `ray stop`); a live GCS answers in milliseconds.
RUNNING_RAY_PROBE_S = 1.0
# The logger of Ray's notice, at a local start, that token authentication is on (its
# default: nothing to do), and the notice's words; its warning that it is OFF is kept.
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_NOTICE = "Token authentication is enabled"


def check_address(address: str | None) -> None:
    """Refuse an `address` that is not a Ray address (before Ray starts)."""
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise ValueError(
            f"address={address!r}; it must be a Ray cluster address (e.g. '10.0.0.1:6379' or "
            f"'ray://host:10001'), 'auto' (the cluster this machine belongs to), "
            f"'{LOCAL_ADDRESS}' (a new local Ray) or None (${ADDRESS_ENV}, else a new local Ray "
            "unless `ray start` runs one on this machine)")


def check_runtime_env(runtime_env: Any) -> dict[str, Any] | None:
    """Refuse a `runtime_env` Ray would refuse (before Ray starts); returns it as a dict.

    A Ray runtime environment (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html)
    as a dict: e.g. {"py_modules": ["my_models"], "env_vars": {"NCCL_DEBUG": "INFO"},
    "pip": ["timm"], "working_dir": "."}; Ray's own RuntimeEnv checks each field. The host
    allocator's setting the workers will read is checked too (`host_allocator`)."""
    if runtime_env is None:
        check_host_allocator()
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env={runtime_env!r}; it must be a dict of Ray runtime "
                        "environment fields (e.g. {'py_modules': [...], 'env_vars': {...}, "
                        "'pip': [...]}) or None")
    from ray.runtime_env import RuntimeEnv

    # Ray passes fields it does not know to plugins; a misspelt one would do nothing.
    unknown = sorted(str(key) for key in runtime_env if key not in RuntimeEnv.known_fields)
    if unknown:
        raise ValueError(f"runtime_env has the field {unknown[0]!r}, which Ray does not know; "
                         "allowed: " + ", ".join(sorted(k for k in RuntimeEnv.known_fields
                                                         if not k.startswith("_"))))
    try:
        RuntimeEnv(**runtime_env)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"runtime_env={runtime_env!r} is not a Ray runtime environment: "
                         f"{exc}") from exc
    check_host_allocator(runtime_env.get("env_vars"))
    return copy.deepcopy(runtime_env)


# The runtime_env of the Ray this module started or joined (None: Ray's default).
_session_runtime_env: dict[str, Any] | None = None


def ensure_ray(address: str | None = None, runtime_env: dict[str, Any] | None = None,
               verbose: int = VERBOSE_DEFAULT) -> bool:
    """Join the Ray cluster the user names, else start a local Ray on loopback.

    In order: a Ray this process already initialised (the user's own `ray.init(...)`) is
    used as it is; `address` (a cluster address, or "auto" for the cluster this machine
    belongs to, e.g. on the head of `ray up`); the RAY_ADDRESS environment variable
    (set by `ray job submit` for a submitted driver); else, or with address="local",
    a new local Ray (`start_local_ray`). Returns True when this call connected or
    started Ray, so the caller should `ray.shutdown()` it (which leaves a joined
    cluster running).

    Nothing named while a Ray that `ray start` started runs on this machine (the head of
    `ray up`): ValueError at once, naming address="auto" and address="local"
    (`refuse_a_second_ray`).

    runtime_env: the job's Ray runtime environment, which every task, Tune trial and
    Train worker of this driver inherits (the user's own modules, environment variables,
    pip packages). A Ray already initialised keeps its own: a different one is refused.
    Worker output reaches this process's terminal (`log_to_driver`).

    verbose (`tula_ray.verbosity`): below 2, Ray's own start lines give way to one line
    naming the dashboard; its warnings and errors stay.
    """
    global _session_runtime_env
    check_address(address)
    runtime_env = check_runtime_env(runtime_env)
    if ray.is_initialized():
        if runtime_env is not None and runtime_env != _session_runtime_env:
            raise ValueError(
                f"runtime_env={runtime_env!r}, but Ray is already initialised in this process "
                f"with {_session_runtime_env or 'no runtime_env known to tula-ray'}: a job's "
                "runtime environment is set when it connects. Give it to the call that starts "
                "Ray (tula_ray.cluster.ray_session(runtime_env=...), or your own "
                "ray.init(runtime_env=...), then leave runtime_env None here)")
        if address not in (None, LOCAL_ADDRESS):
            logger.info("Ray is already initialised in this process; using it, not %r", address)
        return False
    target = address or os.environ.get(ADDRESS_ENV) or None
    if target is None:
        refuse_a_second_ray()
        target = LOCAL_ADDRESS
    # ray.init rewrites the dict it is given (local paths become package URIs): give it a copy.
    if target == LOCAL_ADDRESS:
        ray_context = start_local_ray(runtime_env=copy.deepcopy(runtime_env), verbose=verbose)
    else:
        # An explicit address wins over RAY_ADDRESS; "auto" defers to it (ray.init's rules).
        with _local_only() if _is_loopback_only(target) else contextlib.nullcontext():
            ray_context = ray.init(address=target, runtime_env=copy.deepcopy(runtime_env),
                                   logging_level=ray_log_level(verbose))
        logger.info("joined the Ray cluster at %s (%d nodes)", target,
                    sum(1 for node in ray.nodes() if node["Alive"]))
    _session_runtime_env = runtime_env
    _show_dashboard(ray_context, verbose)
    return True


def _show_dashboard(ray_context: Any, verbose: int) -> None:
    """One line naming the dashboard of the Ray just started or joined (Ray's own start
    lines, which name it too, print at verbose 2 only); none without a dashboard."""
    url = getattr(ray_context, "dashboard_url", None)
    if url:
        show(f"Ray dashboard: {url if '://' in url else 'http://' + url}", verbose)


def running_ray_address() -> str | None:
    """The address of the Ray that `ray start` runs on this machine, if one answers now.

    Ray records the address of the last `ray start --head` (and of `ray start` on a
    worker node) in <Ray's temp dir>/ray_current_cluster (/tmp/ray unless $RAY_TMPDIR) and
    removes it at `ray stop`; a plain `ray.init()` joins that Ray. A record left by a Ray
    that died without `ray stop` is stale: its GCS port no longer accepts connections."""
    from ray._private.services import find_bootstrap_address

    recorded = find_bootstrap_address(None)
    if not recorded:
        return None
    host, _, port = recorded.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RUNNING_RAY_PROBE_S):
            return recorded
    except (OSError, ValueError) as exc:
        logger.info("Ray's record of a running Ray at %s is stale (%s); ignoring it",
                    recorded, exc)
        return None


def refuse_a_second_ray() -> None:
    """ValueError when a Ray that `ray start` started runs on this machine (a cluster head or
    node): with no address named, tula-ray would otherwise start a separate local Ray beside
    it, which sees none of the cluster's nodes."""
    running = running_ray_address()
    if running is not None:
        raise ValueError(
            f"address=None and ${ADDRESS_ENV} is unset, but a Ray started by `ray start` is "
            f"running on this machine at {running} (e.g. this is the head of `ray up`). "
            "tula-ray does not start a second, separate Ray beside it. To run on that "
            "cluster: `--address auto` on the command line, address='auto' in Python (or "
            f"set ${ADDRESS_ENV}); to start a separate local Ray anyway: `--address "
            f"{LOCAL_ADDRESS}`, address='{LOCAL_ADDRESS}'")


def started_ray_here() -> bool:
    """Whether the Ray this process is connected to is one it started itself (a new local
    Ray), not a cluster it joined. Only a joined cluster's autoscaler config describes
    the nodes this Ray can get (tula_ray.cluster.workers)."""
    from ray._private import worker  # Ray keeps the node this driver started there

    node = getattr(worker, "_global_node", None)
    return ray.is_initialized() and node is not None and bool(getattr(node, "head", False))


def start_local_ray(num_cpus: int | None = None, runtime_env: dict[str, Any] | None = None,
                    verbose: int = VERBOSE_DEFAULT) -> Any:
    """A new single-node Ray on this machine whose servers listen on loopback only.

    Ray's core servers bind every interface unless the node address is 127.0.0.1, and
    Ray rewrites 127.0.0.1 to the external address unless its local-only switch is
    off (`_local_only`). Token authentication is left as Ray sets it. Workers' output
    is printed by this driver (Ray's `log_to_driver`), their tracebacks included. Below
    verbose 2, Ray's INFO lines (its start) and its notice that token authentication is on
    are left out. Returns ray.init's context.
    """
    notice = logging.getLogger(TOKEN_NOTICE_LOGGER)
    quiet = ray_log_level(verbose) != "INFO"
    if quiet:
        notice.addFilter(_drop_token_notice)
    try:
        with _local_only():
            return ray.init(
                # "local": always a new local Ray; a bare ray.init() would join any Ray
                # cluster already running on this machine (someone else's, or a test's).
                address=LOCAL_ADDRESS,
                num_cpus=num_cpus,
                _node_ip_address=LOCAL_NODE_IP,
                # Trials hold this instead of a CPU, so N workers can use all N CPUs.
                resources={DRIVER_RESOURCE: DRIVER_SLOTS_DEFAULT},
                include_dashboard=dashboard_installed(),
                dashboard_host=LOCAL_NODE_IP,
                runtime_env=runtime_env,
                logging_level=ray_log_level(verbose),
            )
    finally:
        notice.removeFilter(_drop_token_notice)


def dashboard_installed() -> bool:
    """Whether Ray's dashboard can start: its packages (`pip install "ray[default]"`, which
    tula-ray's install brings) import. A minimal Ray, carried onto a GPU image without
    them, runs without the dashboard, saying so, where `include_dashboard=True` would
    stop ray.init ("Cannot include dashboard with missing packages")."""
    try:
        importlib.import_module("ray.dashboard.optional_deps")  # Ray's list of what it needs
    except ImportError as error:
        logger.warning("Ray's dashboard is off: %s (it needs `pip install \"ray[default]\"`)",
                       error)
        return False
    return True


def _drop_token_notice(record: logging.LogRecord) -> bool:
    """A logging filter: False for Ray's notice that token authentication is on."""
    return not record.getMessage().startswith(TOKEN_NOTICE)


@contextlib.contextmanager
def _local_only() -> Iterator[None]:
    """Ray's local-only switch (`LOCAL_ONLY_ENV` off) for one `ray.init` call.

    Ray reads it once at import (a module constant) and every Ray process reads it from
    its environment; with it off, 127.0.0.1 is not rewritten to the machine's external
    address (measured with Ray 2.60). Both are restored afterwards (the Ray processes
    have started, or connected, by then), so a later `ray start` or join is unaffected.
    """
    from ray._private import ray_constants  # the constant Ray read at import

    saved_env, saved_flag = os.environ.get(LOCAL_ONLY_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(LOCAL_ONLY_ENV, None)
        else:
            os.environ[LOCAL_ONLY_ENV] = saved_env


def _is_loopback_only(address: str) -> bool:
    """A cluster address on 127.0.0.1: a loopback-only Ray, which Ray would otherwise
    try to reach at the machine's external address."""
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in (LOCAL_NODE_IP, "localhost", "::1")


@contextlib.contextmanager
def ray_session(address: str | None = None, runtime_env: dict[str, Any] | None = None,
                verbose: int = VERBOSE_DEFAULT) -> Iterator[None]:
    """`ensure_ray(address, runtime_env, verbose)` for a block (one Ray for several
    searches or trainings); disconnected on exit only if this block connected it."""
    started = ensure_ray(address, runtime_env, verbose)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
