"""How a run to a target evaluates (issue 43, item 1), in one place for the run that does
it (`tula_ray.training.target`, `tula_ray.training.data`) and the plan that prices it
(`tula_ray.planning.target_costs`): a validation split held out of the training set
(`held_out_size`), scored every `evaluation_interval` steps; the test set once, at the end.
"""

from __future__ import annotations

EVALUATIONS_PER_EPOCH_DEFAULT = 4  # eval_every_samples' default: about a quarter epoch
VALIDATION_FRACTION_DEFAULT = 0.1  # the share of the training set held out to judge a target


def held_out_size(dataset_size: int, fraction: float) -> int:
    """The samples a validation split of `fraction` holds out of `dataset_size`: at
    least one."""
    return max(1, int(round(dataset_size * fraction)))


def evaluation_interval(eval_every_samples: int | None, global_batch: int,
                        steps_per_epoch: int) -> int:
    """Steps between two evaluations: `eval_every_samples` rounded to whole steps of
    `global_batch` (at least one), else about a quarter of an epoch."""
    if eval_every_samples is None:
        return max(1, steps_per_epoch // EVALUATIONS_PER_EPOCH_DEFAULT)
    return max(1, round(eval_every_samples / global_batch))
