"""Many scenarios in one spawn of two gloo ranks (a spawn costs seconds; a scenario, less)."""

from pathlib import Path
from typing import Any, Callable, Sequence

import torch.distributed as dist


def run_scenarios(rank: int, directory: str,
                  scenarios: Sequence[tuple[Callable[..., None], Any]]) -> None:
    """Each (function, *args) of `scenarios` in turn, as function(rank, its directory, *args):
    each from a barrier (both ranks start it together, none still in the previous one's
    collectives), its files in a directory of its own (`directory`/its index)."""
    for index, (scenario, *args) in enumerate(scenarios):
        dist.barrier()
        try:
            scenario(rank, str(Path(directory, str(index))), *args)
        except Exception as error:  # which test's scenario broke the run (they all error)
            raise RuntimeError(f"rank {rank}: {scenario.__name__}{tuple(args)!r}") from error
