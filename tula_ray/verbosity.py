"""How much a run prints (issue 41, item 5): one level shared by `search`, `train` and the
command line, the width its lines keep to, and the one function that prints them.

    0  errors and warnings only;
    1  (the default) besides them, a line per finished candidate, a progress line per
       worker group and the Ray dashboard's address; the command line adds the plan;
    2  everything Ray prints too: Ray's start, Ray Tune's boxes (trial configs, status
       tables, results), Ray Train's INFO logs (the workers' set-up and each report's
       dict), as before the level existed. `tula-ray --verbose` is this level.

Errors and warnings print at every level: the levels lower Ray's INFO output only.
"""

from __future__ import annotations

import logging
from typing import Any

from tula_ray.arguments import check_int

QUIET, PROGRESS, EVERYTHING = 0, 1, 2
VERBOSE_DEFAULT = PROGRESS
LINE_WIDTH = 100  # what a default run's lines keep to (a terminal of 100 columns)
INDENT = "    "  # a wrapped line's continuation


def check_verbose(verbose: Any) -> int:
    """`verbose` one of the levels (0, 1, 2), not a bool."""
    return check_int("verbose", verbose, minimum=QUIET, maximum=EVERYTHING,
                     hint="0: errors and warnings only, 1: progress lines (the default), "
                          "2: everything Ray prints too")


def ray_log_level(verbose: int) -> str:
    """The level of Ray's own loggers for a run (Ray's start, Tune, Ray Train's controller
    and workers): Ray's default, INFO, only when everything is asked for."""
    return "INFO" if verbose >= EVERYTHING else "WARNING"


def set_worker_log_level(level: str) -> None:
    """On a Ray Train worker, the root logger at `level` (`ray_log_level`). Ray Train's
    LoggingConfig sets the level of its loggers named ray.train.*, but it logs each report
    (the whole metrics dict) under a logger named after its source file, which reaches
    the root logger it sets to INFO on every worker."""
    logging.getLogger().setLevel(level)


def tune_verbosity(verbose: int) -> int:
    """Ray Tune's `verbose` for a run: its boxes (1, what tula-ray always showed before)
    only when everything is asked for; tula-ray's own lines replace them otherwise."""
    return 1 if verbose >= EVERYTHING else 0


def wrap(text: str, width: int = LINE_WIDTH) -> str:
    """`text` with each line longer than `width` broken between words, continuations
    indented, so that no line is wider: a word longer than a line (a URL) is cut after
    one of its "/" (else at the width), its first piece where the line has room."""
    return "\n".join(piece for line in text.splitlines() for piece in _wrapped(line, width))


def _wrapped(line: str, width: int) -> list[str]:
    if len(line) <= width:
        return [line]
    body = line.lstrip(" ")
    lines, current = [], line[:len(line) - len(body)]  # the line's own indent is kept
    for word in body.split():
        if current.strip():  # after the line's last word, a space
            if len(current) + 1 + len(word) <= width:
                current += " " + word
                continue
            if len(INDENT) + len(word) <= width:  # whole, on a line of its own
                lines.append(current)
                current = INDENT + word
                continue
            current += " "
        start, current = len(current), current + word
        while len(current) > width:  # a word no line holds: cut after a "/" that fits
            slash = current.rfind("/", start, width)
            cut = slash + 1 if slash >= start else width
            lines.append(current[:cut].rstrip())
            current, start = INDENT + current[cut:], len(INDENT)
    return [*lines, current]


def show(line: str, verbose: int) -> None:
    """Print a progress line of a run at level 1 and above, wrapped to LINE_WIDTH.

    The one place a library module prints (Ray Tune's own progress reporters print too):
    a progress line must reach a user's terminal whatever their logging setup is."""
    if verbose >= PROGRESS:
        print(wrap(line), flush=True)
