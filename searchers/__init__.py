"""Ray Tune searchers of tula-ray."""

from searchers.tula_searcher import TulaSearcher

__all__ = ["TulaSearcher"]
