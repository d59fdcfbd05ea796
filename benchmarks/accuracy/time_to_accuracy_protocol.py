"""The time-to-accuracy benchmark's re-run protocol, version 2 (issue 43, item 4), fixed here
before its first run is recorded (tests/test_benchmark_protocols.py checks the order from git
history); its results are results/time_to_accuracy_v2.*, version 1's stay as recorded.

What changes from version 1 (`benchmarks.accuracy.time_to_accuracy`): every run is
`tula_ray.train` stopping at the target (`target_accuracy=`, evaluated every
`EVAL_EVERY_SAMPLES` samples), not epochs of a Ray-free loop times `train`'s step time (v1's
"measured" seconds were that composite); "train at M0" (B = `REFERENCE_BATCH`) is a row of
its own, the baseline a user has without a plan; every regret carries a bootstrap interval;
and only validation data inform a choice (E0, the best B, the targets), the test set read
once per run, for the report.

Data: v1's, so the two versions answer the same question: the CNN trains on Fashion-MNIST's
first `TRAIN_IMAGES` training images (the workload the plan searched) and is judged on the
`VALIDATION_IMAGES` after them (the workload's own val_dataset_fn, never the test set).
Targets: v1's 82, 86 and 87 %, chosen on v1's validation runs (seeds 0-4, see its report);
the seeds here are new ones (`SEEDS`), so the runs that judge the targets did not pick them.
Time to a target: `train`'s `time_to_target_s` less its evaluations (each the run's mean),
the first evaluation that reaches it; never reached: +inf. Per B the median over the seeds.
Regret of a choice: median time at its B over the least median time of any B, less one; its
interval from `BOOTSTRAP` resamples of every B's seeds, the best B picked again in each
resample (`benchmarks.accuracy.time_to_accuracy_regret`).
"""

from __future__ import annotations

from benchmarks.common.bootstrap import Bootstrap

PROTOCOL_VERSION = 2
RESULTS_NAME = "time_to_accuracy_v2"
WORKLOAD = "fashion-mnist-cnn"
TRAIN_IMAGES = 10_000  # Fashion-MNIST's training images [0, 10k): v1's subset
VALIDATION_IMAGES = 10_000  # [10k, 20k): v1's held-out split, now train's val_dataset_fn
TARGETS = (0.82, 0.86, 0.87)  # v1's, chosen on v1's validation runs (its report says how)
SEEDS = (5, 6, 7, 8, 9)  # none of v1's 0-4, whose runs informed the targets
BATCHES = (32, 64, 128, 256, 512, 1024, 2048)  # the demo grid's N = 2 row, as v1
WORLD_SIZE = 2
STRATEGY = "ags-ns"  # the plan's default training strategy (what `train(plan)` runs)
REFERENCE_BATCH = 32  # M0: "train at M0", the baseline row, and E0's batch
EVAL_EVERY_SAMPLES = 2_500  # a quarter of an epoch of the training images
MAX_EPOCHS = 60  # v1's slowest (B = 2048) reached 87 % within 47 epochs in every seed
SEARCHES = 3  # plans judged, each a new `tula_ray.search` (v1's count)
TIME_MEASURE = "train_seconds"  # time_to_target_s less the evaluations before it
BOOTSTRAP = Bootstrap(resamples=10_000, seed=0, percentiles=(2.5, 97.5))
# What "a recorded run" is: any results file of this version, committed (quick ones never are).
RESULTS_GLOBS = (f"benchmarks/results/{RESULTS_NAME}.*", f"benchmarks/results/{RESULTS_NAME}_*")
