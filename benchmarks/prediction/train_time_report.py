"""The train-time benchmark's report (`benchmarks.prediction.train_time`): its result as markdown,
the file's and the screen's."""

from __future__ import annotations

import numpy as np

from benchmarks.common import markdown_table


def report(result: dict) -> str:
    p, s = result["provenance"], result["summary"]
    lines = ["## Predicted against measured epoch time (issue 24)\n",
             f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
             f"The plan's `epoch_time_s` (the profiled step, data path included, times the "
             f"epoch's whole steps; the measured row's own steps where profiled) against "
             f"`tula_ray.train`'s `seconds`, median of epochs 2-{result['epochs']} of each "
             f"run, median over {result['repeats']} interleaved runs; spread = (max - min) / "
             f"median of the runs. The plan is the first search's, written before the runs, never "
             f"refitted; `spread of plans` is that of the {result['repeats']} searches' "
             f"predictions of the cell (one search before each repeat of the runs).\n"]
    body = [[r["workload"], r["num_workers"], r["global_batch"], f"{r['predicted_s']:.2f}",
             f"{r['model_s']:.2f}", f"{r['measured_s']:.2f}", f"{r['ratio']:.3f}",
             f"{r['repeat_spread']:.1%}", _spread(r), f"{r['eval_predicted_s']:.2f}",
             f"{r['eval_measured_s']:.2f}"] for r in result["rows"]]
    lines.append(markdown_table(["workload", "N", "B", "plan s (measured row)", "model fit s",
                                 "train s", "plan / train", "spread of runs", "spread of plans",
                                 "eval plan s", "eval train s"], body))
    if s["median_abs_error"] is not None:
        lines.append(f"\n- Over the grid: median |predicted / measured - 1| = "
                     f"{s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%} "
                     "(fp32; goal: <= 5 %, worst <= 15 %).")
    lines += _searches(result)
    lines += _evaluation_line(result["rows"])
    if s.get("bf16_abs_errors"):
        each = ", ".join(f"{e:.1%}" for e in s["bf16_abs_errors"])
        lines.append(f"- The CNN in bf16 (its own search and runs; not in the figures above): "
                     f"|predicted / measured - 1| = {each}.")
    for ratio in result.get("precision", []):
        lines.append(f"- bf16 / fp32 epoch at N = {ratio['num_workers']}, B = "
                     f"{ratio['global_batch']}: the plans say {ratio['predicted']:.2f}, "
                     f"`train` {ratio['measured']:.2f}.")
    two = result.get("summary_two_runs")
    if two and two["median_abs_error"] is not None:
        lines.append(f"- The same grid with only each cell's first 2 runs (their mean): "
                     f"median {two['median_abs_error']:.1%}, worst "
                     f"{two['worst_abs_error']:.1%}.")
    if s["demo_abs_error"] is not None:
        each = ", ".join(f"{e:.1%}" for e in s["demo_abs_errors"])
        lines.append(f"- The demo's own choice, trained with the plan's strategy: median "
                     f"{s['demo_abs_error']:.1%} over {len(s['demo_abs_errors'])} searches, "
                     f"each trained after it ({each}; goal <= 10 %).")
    calls = [r for r in result["rows"] if "call_measured_s" in r]
    if calls:
        lines.append("\nThe whole `train` call, what the user waits for (Ray already up): the "
                     "plan's total for the run's epochs (start-up + epochs x (epoch + "
                     "evaluation + checkpoint)) against the call's wall time, median over "
                     "its runs; `outside` is the call's time beyond its epochs' training "
                     "and evaluation; `start-up before` is what the plan's start-up was "
                     "until 2026-11-27 (the launch's start and data load), from the same "
                     "profiles.\n")
        lines.append(markdown_table(
            ["workload", "N", "B", "epochs", "plan total s", "train call s", "plan / call",
             "plan start-up s", "outside s", "start-up before s"],
            [[r["workload"], r["num_workers"], r["global_batch"], r["call_epochs"],
              f"{r['call_predicted_s']:.1f}", f"{r['call_measured_s']:.1f}",
              f"{r['call_predicted_s'] / r['call_measured_s']:.3f}",
              f"{r['startup_predicted_s']:.1f}", f"{r['outside_epochs_s']:.1f}",
              f"{r['startup_before_s']:.1f}"]
             for r in calls]))
        errors = ", ".join(f"{e:.1%}" for e in s["call_abs_errors"])
        signed = np.median([r["call_predicted_s"] / r["call_measured_s"] for r in calls])
        lines.append(f"\n- The whole call: |plan total / call - 1| = {errors}; median "
                     f"{np.median(s['call_abs_errors']):.1%}, signed plan / call median "
                     f"{signed:.3f}.\n")
    if result.get("demo_profiling_wall_s"):
        walls = ", ".join(f"{w:.0f}" for w in result["demo_profiling_wall_s"])
        launches = ", ".join(str(n) for n in result["demo_launches"])
        lines.append(f"- The demo's profiling wall: {walls} s in {launches} worker-group "
                     "launches.")
    for part, commits in result.get("run_commits", {}).items():
        if commits:
            trees = ", ".join(f"{commit} ({count})" for commit, count in commits.items())
            lines.append(f"- The {part}'s runs trained at: {trees}.")
    return "\n".join(lines) + "\n"


def _evaluation_line(rows: list[dict]) -> list[str]:
    """The plan's evaluation pass against `train`'s over every cell that measured one
    (added 2026-11-29 with the pass priced at each local batch, `eval-pricing`)."""
    errors = [abs(r["eval_predicted_s"] / r["eval_measured_s"] - 1) for r in rows
              if np.isfinite(r.get("eval_predicted_s", np.nan))
              and np.isfinite(r.get("eval_measured_s", np.nan))]
    if not errors:
        return []
    return [f"- The evaluation pass (`eval plan s` against `eval train s`, {len(errors)} cells):"
            f" median |plan / train - 1| = {np.median(errors):.1%}, worst {max(errors):.1%}."]


def _spread(row: dict) -> str:
    return f"{row['plans_spread']:.1%}" if "plans_spread" in row else "-"


def _searches(result: dict) -> list[str]:
    """Each search's plan, against every run and against the runs that followed it; the
    median of the plans."""
    searches = [f for f in result.get("searches", []) if f["all_runs"]["median_abs_error"]
                is not None]
    if len(searches) < 2:
        return []

    def figures(key: str) -> str:
        return ", ".join(f"{f[key]['median_abs_error']:.1%} (worst "
                         f"{f[key]['worst_abs_error']:.1%})" for f in searches if f[key])

    lines = [f"- Each of the {len(searches)} searches' plans against the median of every "
             f"run: median {figures('all_runs')}.",
             f"- Each search's plan against the one run of each cell that followed it: "
             f"median {figures('its_runs')}."]
    middle = result.get("median_plan")
    if middle:
        lines.append(f"- The median of the {len(searches)} plans against the median of the "
                     f"runs: median {middle['median_abs_error']:.1%}, worst "
                     f"{middle['worst_abs_error']:.1%}.")
    return lines
