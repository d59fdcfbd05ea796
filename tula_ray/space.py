"""The search space: cluster sizes N, global batch sizes B, local batch b = B/N.

Paper §III-A3: the feasible space is bounded below by the user's minimum batch
and cluster size, above by the largest available cluster and by the largest
batch the memory model allows. Candidates grow geometrically (paper §IV-B:
N in [2, 4, 8, 16], B from 32 doubling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tula_ray.arguments import check_int

MIN_BATCH_DEFAULT = 32  # paper §IV-B
BATCH_GROWTH_DEFAULT = 2  # paper §IV-B: batches grow exponentially


@dataclass(frozen=True, order=True)
class Candidate:
    """One configuration: N data-parallel workers sharing a global batch of B samples."""

    num_workers: int
    global_batch: int

    @property
    def local_batch(self) -> int:
        """Samples each worker processes per step (b = B / N)."""
        return self.global_batch // self.num_workers

    def as_dict(self) -> dict[str, int]:
        return {
            "num_workers": self.num_workers,
            "global_batch": self.global_batch,
            "local_batch": self.local_batch,
        }


@dataclass(frozen=True)
class ProfileGrid:
    """What one profiling trial profiles: one cluster size N at its global batches, smallest
    first. The trial config carries it as JSON (`num_workers`, and `global_batches` or one
    `global_batch`: what the searcher suggests and Tune stores); `of_config` reads it
    there once, and the trial, its worker loop and its sweep take it typed."""

    num_workers: int
    global_batches: tuple[int, ...]

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> "ProfileGrid":
        batches = config.get("global_batches")
        if batches is None:
            batches = [config["global_batch"]]
        return cls(int(config["num_workers"]), tuple(sorted(int(b) for b in batches)))

    @property
    def first_batch(self) -> int:
        """The smallest B: where the sweep also times the epoch's costs and the strategy."""
        return self.global_batches[0]

    @property
    def last_batch(self) -> int:
        """The largest B: where the sweep times the evaluation pass again."""
        return self.global_batches[-1]


def check_batch_in_dataset(label: str, batch: int, dataset: str, dataset_size: int | None,
                           hint: str = "") -> None:
    """A global batch (or min_batch) needs at least as many samples as it takes: the one
    check of B against the dataset, wherever its size becomes known (the search's request,
    a profiling trial, its sweep, `train`'s job). None: the size is not known yet."""
    if dataset_size is not None and batch > dataset_size:
        raise ValueError(f"{label}={batch} is larger than the dataset of {dataset} "
                         f"({dataset_size} samples){hint}")


def check_positive_ints(name: str, values: Iterable[int]) -> tuple[int, ...]:
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} is empty; give at least one positive integer")
    for index, value in enumerate(values):
        check_int(f"{name}[{index}]", value, minimum=1)
    return tuple(sorted(set(values)))


def _check_range(name: str, low: int, high: int) -> None:
    for label, value in ((f"min_{name}", low), (f"max_{name}", high)):
        check_int(label, value, minimum=1)
    if low > high:
        raise ValueError(
            f"min_{name}={low} is larger than max_{name}={high}; min must be <= max"
        )


def geometric(low: int, high: int, growth: int = BATCH_GROWTH_DEFAULT) -> tuple[int, ...]:
    """low, low*growth, low*growth^2, ... while <= high."""
    _check_range("batch", low, high)
    check_int("growth", growth, minimum=2)
    values = [low]
    while values[-1] * growth <= high:
        values.append(values[-1] * growth)
    return tuple(values)


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    """Powers of two in [low, high], plus low and high themselves."""
    _check_range("workers", low, high)
    values = {low, high}
    power = 1
    while power <= high:
        if power >= low:
            values.add(power)
        power *= 2
    return tuple(sorted(values))


@dataclass(frozen=True)
class SearchSpace:
    """Every (N, B) pair of `cluster_sizes` x `batch_sizes` with B divisible by N."""

    cluster_sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "cluster_sizes", check_positive_ints("cluster_sizes", self.cluster_sizes)
        )
        object.__setattr__(
            self, "batch_sizes", check_positive_ints("batch_sizes", self.batch_sizes)
        )
        bad = [(n, b) for n in self.cluster_sizes for b in self.batch_sizes if b % n]
        if bad:
            n, b = bad[0]
            raise ValueError(
                f"global batch {b} is not divisible by cluster size {n} "
                f"({len(bad)} such pairs); every batch size must be a multiple of every "
                f"cluster size, e.g. use batch sizes that are multiples of "
                f"{_lcm(self.cluster_sizes)}"
            )

    @classmethod
    def build(
        cls,
        cluster_sizes: Sequence[int] | None = None,
        *,
        min_workers: int = 1,
        max_workers: int | None = None,
        min_batch: int = MIN_BATCH_DEFAULT,
        max_batch: int | None = None,
        batch_sizes: Sequence[int] | None = None,
        growth: int = BATCH_GROWTH_DEFAULT,
    ) -> "SearchSpace":
        """A space from the user's bounds.

        cluster_sizes: explicit N values; otherwise powers of two in [min_workers, max_workers].
        batch_sizes: explicit B values; otherwise geometric from min_batch to max_batch.
        """
        if cluster_sizes is None:
            if max_workers is None:
                raise ValueError("give cluster_sizes or max_workers (the largest cluster size)")
            cluster_sizes = powers_of_two(min_workers, max_workers)
        if batch_sizes is None:
            if max_batch is None:
                raise ValueError(
                    "give batch_sizes or max_batch (the largest global batch; "
                    "tula_ray.search() derives it from the memory model)"
                )
            batch_sizes = geometric(min_batch, max_batch, growth)
        return cls(tuple(cluster_sizes), tuple(batch_sizes))

    @classmethod
    def of_pairs(cls, num_workers: Iterable[int], global_batches: Iterable[int]) -> "SearchSpace":
        """The space spanned by recorded (N, B) pairs (e.g. a profile table's columns): every
        N and every B they name."""
        return cls(tuple(sorted({int(n) for n in num_workers})),
                   tuple(sorted({int(b) for b in global_batches})))

    def candidates(self) -> list[Candidate]:
        return [Candidate(n, b) for n in self.cluster_sizes for b in self.batch_sizes]

    def bounded(self, max_local_batch: int, max_global_batch: int | None = None) -> "SearchSpace":
        """Drop batch sizes no cluster size can run: B > max N x max local batch.

        Pairs with a smaller N that exceed the local bound stay in the grid; the
        plan marks them infeasible rather than dropping them silently.
        """
        limit = max_local_batch * self.cluster_sizes[-1]
        if max_global_batch is not None:
            limit = min(limit, max_global_batch)
        kept = tuple(b for b in self.batch_sizes if b <= limit)
        if not kept:
            raise ValueError(
                f"no batch size fits: the smallest is {self.batch_sizes[0]} but the bound is "
                f"{limit} (max local batch {max_local_batch} x {self.cluster_sizes[-1]} workers); "
                "lower min_batch or give the device more memory"
            )
        return SearchSpace(self.cluster_sizes, kept)


def corner_sizes(sizes: Iterable[int], workers_per_node: int | None = None) -> list[int]:
    """The cluster sizes partial search profiles: the smallest and the largest N (paper
    §III-A2) and, where nodes hold G workers, the largest N on one node, so that each
    sync level (`tula_ray.models.sync_levels`) has its own rows (issue 26)."""
    ordered = sorted(set(int(n) for n in sizes))
    if not ordered:
        return []
    picked = {ordered[0], ordered[-1]}
    if workers_per_node is not None:
        one_node = [n for n in ordered if n <= workers_per_node]
        if one_node:
            picked.add(one_node[-1])
    return sorted(picked)


def corners(candidates: Iterable[Candidate], workers_per_node: int | None = None
            ) -> list[Candidate]:
    """The extremes of a set of (N, B) pairs: at each of `corner_sizes` N, the smallest and
    the largest B present at that N (paper §III-A2's partial search)."""
    pairs = sorted(set(candidates))
    if not pairs:
        return []
    picked = []
    for n in corner_sizes([c.num_workers for c in pairs], workers_per_node):
        at_n = [c for c in pairs if c.num_workers == n]
        picked += [at_n[0], at_n[-1]]
    return sorted(set(picked))


def middle(candidates: Iterable[Candidate]) -> Candidate | None:
    """Of candidates at one N, the one strictly between the smallest and the largest B
    nearest their geometric mean (ties: the smaller B); None with no B between them.
    Partial search times it beside the ends (`PartialSearch`, middle=True)."""
    ordered = sorted(set(candidates), key=lambda c: c.global_batch)
    inner = ordered[1:-1]
    if not inner:
        return None
    centre = (math.log(ordered[0].global_batch) + math.log(ordered[-1].global_batch)) / 2
    return min(inner, key=lambda c: (abs(math.log(c.global_batch) - centre), c.global_batch))


def _lcm(values: Iterable[int]) -> int:
    from math import lcm

    return lcm(*values)
