"""python -m benchmarks NAME [--quick]: regenerate a figure set of BENCHMARKS.md.

Each benchmark writes benchmarks/results/NAME.json and NAME.md; BENCHMARKS.md is
then rebuilt from those .md files alone, so it holds only figures a script wrote.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from benchmarks.common import RESULTS_DIR

# NAME -> the module whose run(quick=...) it is (each names its results, NAME.json/.md, and
# its report), by kind: what the plan predicts, training, accuracy, start-up, the GPU run.
BENCHMARKS = {"search": "benchmarks.prediction.search_cost",
              "ags-overhead": "benchmarks.training.ags_overhead",
              "generalization": "benchmarks.training.generalization",
              "memory": "benchmarks.prediction.memory_accuracy",
              "batch-finder": "benchmarks.prediction.batch_finder",
              "prediction": "benchmarks.prediction.prediction",
              "simulation": "benchmarks.prediction.strategy_simulation",
              "first-contact": "benchmarks.startup.first_contact",
              "train-time": "benchmarks.prediction.train_time",
              "eval-pricing": "benchmarks.prediction.eval_pricing",
              "eval-probe": "benchmarks.prediction.eval_probe",
              "target-eval": "benchmarks.prediction.target_eval",
              "profiling-wall": "benchmarks.startup.profiling_wall",
              "profile-agreement": "benchmarks.startup.profile_agreement",
              "demo-startup": "benchmarks.startup.demo_startup",
              "demo-output": "benchmarks.startup.demo_output",
              "launch-overhead": "benchmarks.startup.launch_overhead",
              "ray-floor": "benchmarks.startup.ray_floor",
              "noise-evolution": "benchmarks.accuracy.noise_evolution",
              "online-noise": "benchmarks.accuracy.online_noise",
              "profile-noise": "benchmarks.accuracy.profile_noise",
              "equal-progress": "benchmarks.training.equal_progress",
              "time-to-accuracy": "benchmarks.accuracy.time_to_accuracy",
              "time-to-accuracy-v2": "benchmarks.accuracy.time_to_accuracy_v2",
              "adaptive-batch": "benchmarks.accuracy.adaptive_batch",
              "adaptive-batch-v2": "benchmarks.accuracy.adaptive_batch_v2",
              "adaptive-batch-v3": "benchmarks.accuracy.adaptive_batch_v3",
              "adaptive-batch-v4": "benchmarks.accuracy.adaptive_batch_v4",
              "adaptive-start-cost": "benchmarks.training.adaptive_start_cost",
              "strategy-extra": "benchmarks.training.strategy_extra",
              "host-allocator": "benchmarks.training.host_allocator",
              "own-model": "benchmarks.startup.own_model",
              "gpu-acceptance": "benchmarks.gpu.acceptance"}
SEEDED = ("equal-progress", "time-to-accuracy")  # benchmarks that take --seeds
REPORT = Path(__file__).parents[1] / "BENCHMARKS.md"
HEADER = """# Benchmarks

Every figure below was written by a script in `benchmarks/` (command, commit, date
and machine above each table); regenerate with `python -m benchmarks all`.
`--quick` runs a tiny grid as a smoke test and does not touch this file.
"""


def report_text() -> str:
    """BENCHMARKS.md: the header, then every recorded report (results/*.md), by name."""
    sections = [path.read_text() for path in sorted(RESULTS_DIR.glob("*.md"))
                if not path.stem.endswith("_quick")]
    return "\n".join([HEADER, *sections])


def write_report() -> Path:
    REPORT.write_text(report_text())
    return REPORT


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("name", choices=[*BENCHMARKS, "all"])
    parser.add_argument("--quick", action="store_true", help="tiny grid: a smoke test")
    parser.add_argument("--from-saved", action="store_true",
                        help="prediction only: analyse the plans the last run saved again, "
                             "without profiling (e.g. after a crash in the analysis)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="gpu-acceptance only: run it on the CPU when no GPU is visible")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"{', '.join(SEEDED)} only: run and report the first SEEDS seeds "
                             "(a session short of time; the rest resume later)")
    args = parser.parse_args()
    if args.from_saved and args.name != "prediction":
        parser.error("--from-saved is for the prediction benchmark only")
    if args.allow_cpu and args.name != "gpu-acceptance":
        parser.error("--allow-cpu is for the gpu-acceptance benchmark only")
    if args.seeds is not None and (args.name not in SEEDED or args.seeds < 1):
        parser.error(f"--seeds is a positive number, for {', '.join(SEEDED)} only")
    extra = {"from_saved": True} if args.from_saved else {}
    if args.allow_cpu:
        extra = {"allow_cpu": True}
    if args.seeds is not None:
        extra = {"seeds": args.seeds}
    # A GPU check is run on its own machine: "all" leaves it out.
    everything = [name for name in BENCHMARKS if name != "gpu-acceptance"]
    for name in everything if args.name == "all" else [args.name]:
        importlib.import_module(BENCHMARKS[name]).run(quick=args.quick, **extra)
    if not args.quick:
        print(f"wrote {write_report()}")


if __name__ == "__main__":
    main()
