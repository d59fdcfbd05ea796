"""Protocol first: a benchmark's protocol (targets, seeds, splits, budgets) is fixed in code and
committed before the first run it governs is recorded, and not changed after. This module
reads that order from git history; tests/test_benchmark_protocols.py checks every protocol.

The order is git's, not the clock's: every commit that touched the protocol file (`git log
--follow`, renames included) must be an ancestor of the first commit that added one of its
results files, and not that commit itself. Commit times (%ct) are only quoted in the
messages: two commits can share a second, and a rebase can reorder times.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class Commit:
    """One commit of a file's history: its hash and its committer time (unix seconds)."""

    sha: str
    time: int


def order_problems(protocol: list[Commit], first_results: Commit | None,
                   is_ancestor: Callable[[str, str], bool]) -> list[str]:
    """What breaks "protocol first", as sentences (none: it holds).

    protocol: the commits that touched the protocol file; first_results: the earliest commit
    that added a results file (None: no run recorded yet, nothing to break);
    is_ancestor(a, b): whether commit a is an ancestor of commit b (a != b).
    """
    if first_results is None:
        return []
    if not protocol:
        return [f"results were first recorded at {first_results.sha[:10]} but the protocol "
                "file was never committed: commit the protocol before any run"]
    return [f"the protocol changed at {c.sha[:10]} (time {c.time}), not before the first "
            f"recorded results at {first_results.sha[:10]} (time {first_results.time}): a "
            "protocol changed after a run needs a new version and new results files"
            for c in protocol
            if c.sha == first_results.sha or not is_ancestor(c.sha, first_results.sha)]


def in_git_checkout(repo: Path = ROOT) -> bool:
    """Whether `repo` is a git work tree with a git to read it (a copied tree is not)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=repo,
                              capture_output=True, text=True)
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "true"


def _git(repo: Path, *args: str) -> list[str]:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


def _commits(lines: list[str]) -> list[Commit]:
    return [Commit(sha, int(time)) for sha, time in (line.split() for line in lines)]


def protocol_commits(protocol: str, repo: Path = ROOT) -> list[Commit]:
    """Every commit that touched the protocol file (path relative to `repo`), newest first."""
    return _commits(_git(repo, "log", "--format=%H %ct", "--follow", "--", protocol))


def first_results_commit(results: list[str], repo: Path = ROOT) -> Commit | None:
    """The earliest commit that added a file matching one of `results` (git pathspec globs
    relative to `repo`, e.g. "benchmarks/results/adaptive_batch.*"); None if none did."""
    added = _commits(_git(repo, "log", "--format=%H %ct", "--diff-filter=A", "--topo-order",
                          "--", *results))
    return added[-1] if added else None


def is_ancestor(older: str, newer: str, repo: Path = ROOT) -> bool:
    done = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=repo,
                          capture_output=True)
    return done.returncode == 0


def protocol_first_problems(protocol: str, results: list[str], repo: Path = ROOT) -> list[str]:
    """`order_problems` of a protocol file and its results files in `repo`'s history."""
    return order_problems(protocol_commits(protocol, repo), first_results_commit(results, repo),
                          lambda a, b: is_ancestor(a, b, repo))
