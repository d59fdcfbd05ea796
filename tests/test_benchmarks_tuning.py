"""The tuned half of the Table I benchmark (`benchmarks.training.tuning`): what it records, what it
resumes, and the runs it plans. The tuner is the test's own (`tula_ray.tune_training` on
Ray is tested in test_tune_training_ray.py); no Ray here."""

from types import SimpleNamespace

import pandas as pd

from benchmarks.training import generalization_report
from benchmarks.training import generalization_runs
from benchmarks.training import tuning

STRATEGIES = {"lrs": ("lrs", {}), "lars": ("lars", {"trust": 0.02})}


def _tuner(calls):
    def tune(plan, strategy, *, trials, epochs, seed, storage_path):
        calls.append((strategy, plan.choice.num_workers, plan.choice.global_batch, trials))
        sampled = {"trust": 0.005} if strategy == "lars" else {}
        return SimpleNamespace(config={"strategy": strategy, "lr": 0.01 * len(calls),
                                       "strategy_options": sampled},
                               val_accuracy=0.8, trials=pd.DataFrame({"x": range(trials)}))
    return tune


def test_each_strategy_is_tuned_once_at_the_tuning_batch_and_recorded(tmp_path):
    path, calls = tmp_path / "tuned.jsonl", []
    common = dict(world_size=2, train_subset=4096, epochs=3, trials=4, path=path)
    tuned = tuning.tune_missing(STRATEGIES, tune=_tuner(calls), **common)
    assert calls == [("lrs", 2, tuning.TUNE_BATCH, 4), ("lars", 2, tuning.TUNE_BATCH, 4)]
    assert tuned["lars"]["strategy_options"] == {"trust": 0.005}  # the tuned value wins
    assert tuned["lrs"]["lr"] == 0.01 and tuned["lrs"]["trials_run"] == 4
    # A second run (a new session) tunes nothing again; a new budget tunes again.
    assert tuning.tune_missing(STRATEGIES, tune=_tuner(calls), **common) == tuned
    assert len(calls) == 2
    tuning.tune_missing({"lrs": STRATEGIES["lrs"]}, tune=_tuner(calls), **{**common, "trials": 5})
    assert calls[-1] == ("lrs", 2, tuning.TUNE_BATCH, 5)
    assert tuning.read_tuned(path)["lrs"]["trials"] == 5


def test_the_tuning_plan_names_the_benchmarks_workload_and_batch():
    plan = tuning.tuning_plan(2, 1024, train_subset=10_000, epochs=20)
    assert (plan.choice.num_workers, plan.choice.global_batch) == (2, 1024)
    assert plan.workload == "fashion-mnist-cnn" and plan.epochs == 20
    assert plan.meta["workload_options"] == {"train_subset": 10_000, "subset_seed": 0}


def test_tuned_configurations_are_run_at_every_batch_and_a_retuning_is_not_reused():
    record = {"label": "lrs", "strategy": "lrs", "lr": 0.02, "strategy_options": {},
              "global_batch": 1024}
    runs = generalization_runs.plan_runs(1000, 2, (0, 1), (512, 1024, 2048),
                                         tuned={"lrs": record})
    tuned = [r for r in runs if r["label"] == "lrs tuned"]
    # Batch by batch, the tuning's batch first, every seed of a batch before the next.
    assert [(r["global_batch"], r["seed"]) for r in tuned] == [
        (1024, 0), (1024, 1), (512, 0), (512, 1), (2048, 0), (2048, 1)]
    assert all(r["lr"] == 0.02 and r["tuned_at"] == 1024 for r in tuned)
    recipe = [r for r in runs if r["label"] == "lrs"]
    assert recipe and all("lr" not in r for r in recipe)  # the recipe's own LR
    again = generalization_runs.plan_runs(1000, 2, (0,), (512,),
                                          tuned={"lrs": {**record, "lr": 0.03}})
    old_keys = {generalization_runs.run_key(r) for r in tuned}
    assert not old_keys & {generalization_runs.run_key(r) for r in again
                           if r["label"] == "lrs tuned"}


def _row(batch, label, accuracy, seeds=3, diverged=0):
    return {"global_batch": batch, "label": label, "test_accuracy_mean": accuracy,
            "seeds": seeds, "diverged": diverged}


def test_the_goals_compare_the_best_ags_with_the_best_rival_and_skip_unfinished_rows():
    summary = [_row(32, "reference", 0.88),
               _row(1024, "ags", 0.80), _row(1024, "ags-ns", 0.872), _row(1024, "lrs", 0.86),
               _row(1024, "ags tuned", 0.85), _row(1024, "ags-ns tuned", 0.84),
               *[_row(1024, label + " tuned", 0.845) for label in ("lbt", "lrs", "lars")],
               _row(1024, "polo tuned", 0.86, seeds=2),  # not finished: the goal waits
               _row(2048, "ags-ns", 0.79, diverged=1),
               *[_row(2048, label, 0.70) for label in ("lbt", "lrs", "lars", "polo")]]
    goals = {(g["goal"].split(":")[0].split(",")[0], g["global_batch"]): g
             for g in generalization_report._goals(summary, (1024, 2048), seeds=3)}
    untuned = goals["untuned", 1024]
    assert (untuned["ags"], untuned["rival"], untuned["met"]) == ("ags-ns", "lrs", True)
    assert goals["tuned", 1024]["met"] is None  # polo tuned has 2 of 3 seeds
    assert goals["untuned", 2048]["met"] is False  # better than every baseline, but diverged
    near = goals["best AGS", 1024]
    assert (near["ags"], near["rival"], near["met"]) == ("ags-ns", "reference", True)
    assert "not finished" in generalization_report._goals_markdown(list(goals.values()))


def test_the_safest_strategy_has_no_diverged_seed_and_the_smallest_worst_shortfall():
    summary = [_row(512, "lrs", 0.87), _row(2048, "lrs", 0.80, diverged=1),
               _row(512, "ags-ns", 0.86), _row(2048, "ags-ns", 0.78),
               _row(512, "lars", 0.82), _row(2048, "lars", 0.79),
               _row(512, "polo", 0.90, seeds=2), _row(2048, "polo", 0.90)]  # not finished
    ranked = generalization_report._shortfalls(summary, (512, 2048), 3,
                                               ["lrs", "ags-ns", "lars", "polo"])
    assert [r["label"] for r in ranked] == ["ags-ns", "lars", "lrs"]
    assert abs(ranked[0]["worst_shortfall"] - 0.02) < 1e-9  # 0.80 - 0.78 at 2048
    assert abs(ranked[1]["worst_shortfall"] - 0.05) < 1e-9  # 0.87 - 0.82 at 512
    assert ranked[-1]["diverged"] == 1


def test_the_ablation_runs_beside_the_recipes_but_not_in_quick_mode():
    runs = generalization_runs.plan_runs(1000, 2, (0,), (512,))
    ablation = [r for r in runs if r["label"] == "ags-ns p=1/2"]
    assert [(r["strategy"], r["options"], r["global_batch"]) for r in ablation] == [
        ("ags-ns", {"gain_exponent": 0.5}, 512)]
    quick = generalization_runs.plan_runs(1000, 2, (0,), (512,), quick=True)
    assert {r["label"] for r in quick} == {"reference", *generalization_runs.STRATEGY_RUNS}
