"""A search strategy of one's own: profile the diagonal of the grid (the i-th cluster size
with the i-th batch size), fit the model from every usable row."""

import tula_ray
from tula_ray.planning.search_strategies import Proposal, open_candidates
from tula_ray.profile_table import usable


class DiagonalSearch:
    name = "diagonal"

    def propose(self, grid, rows):
        sizes = sorted({c.num_workers for c in grid})
        batches = sorted({c.global_batch for c in grid})
        diagonal = {(n, batches[min(i, len(batches) - 1)]) for i, n in enumerate(sizes)}
        todo = [c for c in open_candidates(grid, rows) if (c.num_workers, c.global_batch) in diagonal]
        return Proposal(tuple(todo), "the diagonal" if todo else "the diagonal is measured")

    def fit_rows(self, rows):
        return usable(rows)


tula_ray.register_search_strategy("diagonal", DiagonalSearch)
