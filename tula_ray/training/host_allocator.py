"""The host allocator a training process steps with: glibc's malloc, held steady.

On the CPU every step allocates and frees its activations and gradients, megabytes
each. glibc's malloc serves a block above its mmap threshold with a fresh mapping and
gives the heap's top back to the system above its trim threshold; both thresholds adapt
as the process runs. Until they settle, a step can fault its buffers' pages in again
and again. On this project's 2-CPU machine (`python -m benchmarks host-allocator`: the
Fashion-MNIST CNN, fresh processes), the profile of a launch's first batch read up to 39 %
over the steps its own process trained at later (median 21 %), at B = 32 to 512, while
the steps trained were the same with either allocator.

`steady_host_allocator` fixes both thresholds high (glibc's `mallopt`, as its
`MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` tunables would): the buffers are
reused from the heap, and a process steps at one speed from its first step (there: the
profile within a median 1.7 %, at most 9.6 %, of the same process's epochs). The cost is
that the heap keeps its peak (it is not given back until the process ends), what a
training process reuses every step anyway. Called where every profile and every run
begins (`Sweep`, `prepare_run`), so that the profile and `train` step alike.
Set TULA_RAY_HOST_ALLOCATOR=default in the workers' environment (Ray's `runtime_env`
env_vars) to leave glibc's adaptive thresholds. Not glibc (macOS, musl): nothing to do.
`node_memory_bytes`: the RAM that heap lives in (a CPU worker's device memory).
No Ray here (core module).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Any, Mapping

logger = logging.getLogger(__name__)

ENV = "TULA_RAY_HOST_ALLOCATOR"
STEADY, DEFAULT = "steady", "default"
# mallopt's parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# Blocks below this come from the heap (a batch's activations: the CNN's at B = 2048
# are ~200 MB); the heap's free top is kept up to this.
THRESHOLD_BYTES = 1 << 30

_applied: str | None = None


def steady_host_allocator() -> str:
    """Fix glibc's mmap and trim thresholds at THRESHOLD_BYTES in this process, once.
    Returns what holds: "steady", "default" (TULA_RAY_HOST_ALLOCATOR=default), or why
    nothing was done (not glibc, or mallopt refused)."""
    global _applied
    if _applied is None:
        _applied = _apply(os.environ.get(ENV, STEADY))
    return _applied


def check_setting(env_vars: Mapping[str, Any] | None = None) -> None:
    """Before any worker starts: the setting the workers will read, from this process's
    environment (a local Ray's workers inherit it) and from a runtime_env's `env_vars`,
    is one allowed (else ValueError, naming it)."""
    for where, value in (("this process's environment", os.environ.get(ENV)),
                         ("runtime_env's env_vars", (env_vars or {}).get(ENV))):
        if value is not None:
            _check(value, f" (in {where})")


def _check(mode: str, where: str = "") -> None:
    if mode not in (STEADY, DEFAULT):
        raise ValueError(f"{ENV}={mode!r}{where}; allowed: {STEADY!r} (the default) or "
                         f"{DEFAULT!r}")


def _apply(mode: str) -> str:
    _check(mode)
    if mode == DEFAULT:
        return DEFAULT
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return "not glibc"
    if not (mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES)
            and mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES)):
        logger.debug("glibc's mallopt refused the thresholds: its adaptive ones are kept")
        return "mallopt refused"
    return STEADY


def _glibc_mallopt():
    """glibc's mallopt(int, int) -> int, or None where this process has no glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc's own symbol: musl has mallopt but ignores it
        mallopt = libc.mallopt
    except (AttributeError, OSError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def node_memory_bytes() -> int:
    """RAM of this machine, in bytes: the host memory a CPU worker steps in."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
