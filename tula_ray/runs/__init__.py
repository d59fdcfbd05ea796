"""The entry points, one module each, which import Ray: `search` (the search and its Tune
experiment in search_experiment), `train`, `tune_training`. The search entry and the
training entry never import each other; the package exposes the functions as
`tula_ray.search`, `tula_ray.train` and `tula_ray.tune_training`.
"""
