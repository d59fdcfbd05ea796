"""What each `tula-ray` command runs. Ray and torch are imported only here, when a
command runs, so `tula-ray --help` stays fast."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from tula_ray.cli.options import (METRICS_FILE, REPLAY_DATASET_SIZE_DEFAULT,
                                  REPLAY_EPOCHS_DEFAULT, SHOWN_COLUMNS, TUNED_FILE)
from tula_ray.planning.candidates import UNTRAINABLE
from tula_ray.planning.context import PlanContext
from tula_ray.planning.plan import Plan, build_plan
from tula_ray.planning.run_check import against_plan_line
from tula_ray.space import SearchSpace
from tula_ray.verbosity import EVERYTHING, PROGRESS, wrap


def verbosity(args: argparse.Namespace) -> int:
    """The `verbose` of tula_ray.search and train for a command line: `--verbose`, 2."""
    return EVERYTHING if args.verbose else PROGRESS


def write_plan(plan: Plan, out: Path) -> None:
    print(plan.summary())
    plan.to_json(out / "plan.json")
    figures = plan.plot(out)
    print(wrap(f"wrote {out / 'plan.json'} and {', '.join(str(f) for f in figures)}"))


def run_tune(args: argparse.Namespace) -> None:
    """`tula-ray tune`: the plan file must exist before Ray is started."""
    import json

    if not args.plan.is_file():
        raise FileNotFoundError(f"plan file {args.plan} does not exist; write one with "
                                "`tula-ray demo` or `tula-ray replay`")
    from tula_ray.runs.tune_training import tune_training  # imports ray

    trials = {} if args.trials is None else {"trials": args.trials}
    best = tune_training(args.plan, args.strategy, epochs=args.epochs, workload=args.workload,
                         storage_path=args.storage_path, address=args.address,
                         runtime_env=args.runtime_env, **trials)
    print(f"best of {len(best.trials)} trials: validation accuracy {best.val_accuracy:.4f} "
          f"with {best.config}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / TUNED_FILE).write_text(json.dumps(best.config, indent=1))
    print(f"wrote {args.out / TUNED_FILE}; train it with "
          f"`tula-ray train {args.plan} --config {args.out / TUNED_FILE}`")


def run_train(args: argparse.Namespace) -> None:
    """`tula-ray train`: the plan file must exist before Ray is started."""
    if not args.plan.is_file():
        raise FileNotFoundError(f"plan file {args.plan} does not exist; write one with "
                                "`tula-ray demo` or `tula-ray replay`")
    train_and_write_metrics(args.plan, args, workload=args.workload)


def train_and_write_metrics(plan: Any, args: argparse.Namespace,
                            workload: str | None = None) -> None:
    """Train `plan` (a Plan or a path), print the per-epoch table, write the metrics CSV."""
    from tula_ray.runs.train import train  # imports ray

    storage = args.storage_path
    retries = {key: getattr(args, key) for key in ("max_failures", "keep_checkpoints",
                                                   "collective_timeout_s")
               if getattr(args, key, None) is not None}
    tuned = _tuned_config(getattr(args, "config", None)) or {"strategy": args.strategy}
    result = train(plan, workload=workload, epochs=args.epochs, storage_path=storage,
                   address=args.address, runtime_env=args.runtime_env,
                   precision=args.precision, budget=args.budget, verbose=verbosity(args),
                   **_target_options(args), **tuned, **retries)
    shown = [c for c in SHOWN_COLUMNS if c in result.metrics.columns]
    print(f"trained N={result.num_workers}, B={result.global_batch} with {result.strategy}:")
    print(result.metrics[shown].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if result.target is not None:
        print(target_line(result.target))
    if "batch_switches" in result.metrics:  # an adaptive batch's run
        print(schedule_line(result.batch_schedule))
    elif result.planned is not None:
        print(wrap(against_plan_line(result.against_plan())))
    args.out.mkdir(parents=True, exist_ok=True)
    result.metrics.to_csv(args.out / METRICS_FILE, index=False)
    print(f"wrote {args.out / METRICS_FILE}; last checkpoint {result.checkpoint_path}")


def _target_options(args: argparse.Namespace) -> dict[str, Any]:
    """`train`'s target keywords from the command line (`demo --train` has them too)."""
    return {key: getattr(args, key, None)
            for key in ("target_accuracy", "eval_every_samples", "validation_fraction", "batch")
            if getattr(args, key, None) is not None}


def schedule_line(schedule: pd.DataFrame) -> str:
    """An adaptive batch's decisions, for a person: how many, and each switch."""
    if schedule.empty:
        return "adaptive batch: no decision was recorded"
    switches = schedule[schedule["switched"]]
    moves = "; ".join(f"{row.reason} at sample {int(row.samples)}"
                      for row in switches.itertuples())
    return (f"adaptive batch: {len(schedule)} decisions, {len(switches)} switches"
            + (f": {moves}" if moves else f", B {int(schedule['global_batch'].iloc[-1])} kept"))


def target_line(target: dict[str, Any]) -> str:
    """A run to a target's outcome, for a person."""
    if not target["target_reached"]:
        return (f"target accuracy {target['target_accuracy']:g} not reached "
                f"({target['evaluations']} evaluations of the validation split)")
    return (f"target accuracy {target['target_accuracy']:g} reached in "
            f"{target['time_to_target_s']:.1f} s, {int(target['samples_to_target'])} samples, "
            f"{int(target['steps_to_target'])} steps")


def _tuned_config(path: Path | None) -> dict[str, Any] | None:
    """The train() keywords a `tula-ray tune` run wrote (strategy, lr, strategy_options)."""
    import json

    if path is None:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist; write one with "
                                "`tula-ray tune`")
    config = json.loads(path.read_text())
    if not isinstance(config, dict) or set(config) - {"strategy", "lr", "strategy_options"}:
        raise ValueError(f"{path}: expected the keys strategy, lr, strategy_options that "
                         f"`tula-ray tune` writes, got {sorted(config) if isinstance(config, dict) else config!r}")
    return config


@contextlib.contextmanager
def _ray_for(enabled: bool, address: str | None, runtime_env: dict[str, Any] | None,
             verbose: int) -> Iterator[None]:
    """One Ray for several steps (demo: search then train) instead of one each."""
    if not enabled:
        yield
        return
    from tula_ray.cluster import ray_session  # imports ray

    with ray_session(address, runtime_env, verbose):
        yield


def run_replay(args: argparse.Namespace) -> None:
    meta: dict = {"source": "replay"}
    untrainable: dict = {}
    plain: set = set()  # where the plan's training strategy trains plain SGD steps
    workers_per_node = None  # one node holds every N, unless the plan replayed says not
    eval_at_local_batch = False  # profiles alone do not say how the workload evaluates
    if args.synthetic:
        from tula_ray.planning.synthetic import example_params, synthetic_profiles

        space = SearchSpace.build((1, 2), min_batch=32, max_batch=2048)
        profiles = synthetic_profiles(space.candidates(), example_params(), seed=args.seed)
        workload, epochs, dataset_size = "synthetic", *_replay_sizes(args)
    elif args.profiles is None:
        raise SystemExit("replay needs PROFILES (a CSV of profile rows or a plan.json) "
                         "or --synthetic")
    elif args.profiles.suffix == ".json":
        old = Plan.from_json(args.profiles)
        profiles, workload = old.profiles, old.workload
        # a re-plan for other epochs (E0 of another target) keeps the profiles
        epochs = old.epochs if args.epochs is None else args.epochs
        dataset_size = old.dataset_size if args.dataset_size is None else args.dataset_size
        for key in ("training_strategy", "training_options"):
            meta[key] = old.meta.get(key)
        workers_per_node = old.meta.get("workers_per_node")  # the cluster it was profiled on
        # how its workload evaluates: at the local batch, or at its own eval_batch
        eval_at_local_batch = bool((old.meta.get("plan_context") or {}).get(
            "eval_at_local_batch"))
        space = SearchSpace.of_pairs(old.table["num_workers"], old.table["global_batch"])
        if "trainable" in old.table:  # what the plan's training strategy cannot train
            refused = old.table[~old.table["trainable"].astype(bool)]
            untrainable = {(int(n), int(b)): reason.removeprefix(UNTRAINABLE) for n, b, reason
                           in zip(refused["num_workers"], refused["global_batch"],
                                  refused["infeasible_reason"])}
        if "plain_steps" in old.table:
            rows = old.table[old.table["plain_steps"].astype(bool)]
            plain = set(zip(rows["num_workers"].astype(int), rows["global_batch"].astype(int)))
    else:
        profiles = pd.read_csv(args.profiles, keep_default_na=False, na_values=[""])
        workload, (epochs, dataset_size) = args.profiles.stem, _replay_sizes(args)
        space = SearchSpace.of_pairs(profiles["num_workers"], profiles["global_batch"])
    context = PlanContext(epochs=epochs, dataset_size=dataset_size, objective=args.objective,
                          pricing=args.pricing, reference_batch=args.reference_batch,
                          noise_scale=args.noise_scale, workload=workload,
                          untrainable=untrainable, plain_steps=plain,
                          workers_per_node=workers_per_node,
                          eval_at_local_batch=eval_at_local_batch)
    plan = build_plan(space, profiles, context, search_strategy=args.search_strategy,
                      meta=meta)
    write_plan(plan, args.out)


def _replay_sizes(args: argparse.Namespace) -> tuple[int, int]:
    """(epochs, dataset_size) for profiles that carry neither: the user's, else defaults."""
    return (REPLAY_EPOCHS_DEFAULT if args.epochs is None else args.epochs,
            REPLAY_DATASET_SIZE_DEFAULT if args.dataset_size is None else args.dataset_size)


def run_demo(args: argparse.Namespace) -> None:
    from tula_ray.workloads.fashion_mnist_files import locate

    # Before Ray and torch: a machine with no means to get the data stops in seconds.
    print(wrap(f"Fashion-MNIST: {locate().source}"), flush=True)
    from tula_ray.runs.search import search  # imports ray: only for the commands that run it

    # With --train, one Ray for the search and the training.
    with _ray_for(args.train, args.address, args.runtime_env, verbosity(args)):
        plan = search("fashion-mnist-cnn", cluster_sizes=tuple(args.cluster_sizes),
                      min_batch=args.min_batch, max_batch=args.max_batch,
                      search_strategy=args.search_strategy, objective=args.objective,
                      pricing=args.pricing, address=args.address,
                      storage_path=args.storage_path, training_strategy=args.strategy,
                      runtime_env=args.runtime_env, precision=args.precision,
                      reference_batch=args.reference_batch, noise_scale=args.noise_scale,
                      verbose=verbosity(args))
        write_plan(plan, args.out)
        meta = plan.meta  # why the search stopped: the summary's last line
        print(f"memory probe {meta['probe_wall_s']:.0f} s, profiling "
              f"{meta['profiling_wall_s']:.0f} s: {meta['candidates_profiled']} candidates in "
              f"{meta['launches']} worker-group launches, {meta['rounds']} round(s)")
        if args.train:
            train_and_write_metrics(plan, args)


def run_search_file(args: argparse.Namespace) -> None:
    import inspect

    import yaml

    from tula_ray.runs.search import search

    config = yaml.safe_load(args.config.read_text()) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{args.config}: expected a mapping of tula_ray.search() arguments")
    allowed = set(inspect.signature(search).parameters)
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(f"{args.config}: unknown key {unknown[0]!r}; allowed: {sorted(allowed)}")
    for key in ("address", "runtime_env"):  # the command line wins over the file
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.resume:
        config["resume"] = True
    if args.verbose:  # the command line's --verbose wins over the file's verbose
        config["verbose"] = EVERYTHING
    write_plan(search(**config), args.out)
