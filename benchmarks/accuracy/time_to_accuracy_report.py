"""The time-to-accuracy benchmark's report (`benchmarks.accuracy.time_to_accuracy`): per target,
the plan's predictions against the measured epochs and seconds, and every search's choice."""

from __future__ import annotations

import math
import statistics

from benchmarks.common import markdown_table


def _fmt(value: float, spec: str = ".2f") -> str:
    if math.isnan(value):
        return "n/a"
    return format(value, spec) if math.isfinite(value) else "not reached"


def _regret(value: float) -> str:
    return f"{value:+.0%}" if math.isfinite(value) else "n/a"


def report(result: dict) -> str:
    p, s, d = result["provenance"], result["settings"], result["design"]
    noise = result["noise"] or {}
    lines = ["### Time to accuracy: the plan's choice against measured training (issue 25, "
             "item 4)\n",
             f"`{p['command']}` at {p['commit']}, {p['date']}, {p['machine']}.\n",
             f"Fashion-MNIST CNN, {s['train_subset']}-image subset, {d['strategy']} at N = "
             f"{d['world_size']} (N = 1 not measured: this machine's time), scored after every "
             f"epoch on {s['held_out']} held-out images (the training images after the "
             f"subset's; the test set untouched), up to {s['max_epochs']} epochs; "
             f"seeds {list(s['seeds'])}, medians over them. The plan's noise scale phi = "
             f"{_fmt(noise.get('noise_scale') or math.nan, '.4g')} "
             f"({noise.get('calibration')} x the measured "
             f"{_fmt(noise.get('measured_noise_scale') or math.nan, '.4g')}). E0 is the "
             f"epochs the B = {d['reference_batch']} runs need. This ground truth informed a "
             "choice: the plan's noise calibration, 7.18 until seed 0 of this benchmark "
             "showed the plan's phi 6-12x above the phi fitting the measured epochs, is 1 "
             "since; its held-out split, 20 % of the subset (2000 images) until "
             "2026-11-27, whose sampling error (0.9 points at 80 %) let B = 32 and 64 trade "
             "places by chance near the early target; and the targets, 80 and 85 % until "
             "then: on 10k training images an epoch, B = 32 passed 80 % inside its first "
             "epoch, before any evaluation to interpolate from; 87 % joined 82 and 86 % "
             "when B = 32 was still the fastest at 86 %.\n"]
    # Keyed by B: ints in the run, strings in its recorded JSON.
    steps = {int(batch): step for batch, step in result["train_steps"].items()}
    lines.append(
        "Measured seconds are on `train`'s clock: the measured epochs x (the training "
        "subset's steps at `tula_ray.train`'s median step at that B + the loop's held-out "
        "evaluation); `train` ran " + (
            "nowhere (--quick: the loop's own steps stand in)" if result["quick"] else
            f"{d['train_timed']['epochs']} epochs of the {s['train_subset']}-image subset "
            f"at N = {d['world_size']} per run, {d['train_timed']['repeats']} runs per B, "
            "interleaved, epochs after the first") +
        ". `loop s` is the same on the Ray-free loop's own clock, beside it. A run of the "
        "benchmark reads back what earlier runs recorded (the training runs, `train`'s "
        "timings, the searches' plans) and trains or searches only what is missing: the "
        "commit above made this report, and `git log benchmarks/results/"
        "time_to_accuracy.runs.jsonl` says when its runs were recorded.\n")
    for target, judged in result["targets"].items():
        loop = result["loop_targets"][target]
        lines.append(f"Target validation accuracy {float(target):.0%}: E0 = "
                     f"{_fmt(judged['e0'])} epochs; fastest measured B = "
                     f"{judged['best_batch']} on `train`'s clock, {loop['best_batch']} on "
                     "the loop's.\n")
        body = [[r["global_batch"], _fmt(r["predicted_epochs"]), _fmt(r["measured_epochs"]),
                 _fmt(r["predicted_s"], ".3g"), _fmt(r["measured_s"], ".3g"),
                 _fmt(r["loop_s"], ".3g"),
                 (f"{steps[r['global_batch']]['step_s'] * 1e3:.3g} "
                  f"({steps[r['global_batch']]['spread']:.0%})"
                  if r["global_batch"] in steps else "n/a"),
                 f"{r['reached']}/{r['seeds']}"] for r in judged["rows"]]
        if body:
            lines += [markdown_table(["B", "predicted epochs", "measured epochs",
                                      "predicted s", "measured s", "loop s",
                                      "train's step ms (spread)", "seeds reaching it"],
                                     body), ""]
        for objective, choice in judged["choices"].items():
            on_loop = loop["choices"][objective]
            lines.append(f"- `{objective}` chooses B = {choice['global_batch']}: "
                         f"{_fmt(choice['seconds'], '.3g')} s, regret "
                         + _regret(choice["regret"]) + " (on the loop's clock "
                         + _regret(on_loop["regret"]) + ")")
        if "median_log_error" in judged:
            lines.append(f"- epochs: median |log(predicted / measured)| = "
                         f"{_fmt(judged['median_log_error'])} (goal <= 0.25); Spearman of "
                         f"predicted and measured time = {_fmt(judged['spearman'])} "
                         f"(goal >= 0.8; {_fmt(loop['spearman'])} on the loop's clock); the "
                         "phi that fits the measured epochs best: "
                         f"{_fmt(judged['fitted_noise_scale'], '.4g')}")
        lines.append("")
    lines += _searches_report(result["searches"], list(result["targets"]), (
        f"Every search ({len(result['searches'])}, each a new `tula_ray.search` of the same "
        "workload) against the same ground truth, on `train`'s clock:\n"))
    lines += _at_target_report(result)
    return "\n".join(lines) + "\n"


def _phis(phis: dict[str, dict]) -> str:
    return ", ".join(f"{float(t):.0%}: phi = {_fmt(p['noise_scale'], '.4g')} from step "
                     f"{p['step']:.0f} (seeds {', '.join(_fmt(x, '.4g') for x in p['seeds'])})"
                     for t, p in phis.items())


def _at_target_report(result: dict) -> list[str]:
    """The same searches' plans re-made with phi measured at each target (`noise_scale=`):
    over a window of the reference run's iterates, then at its single iterate."""
    at, targets = result["at_target"], list(result["targets"])
    pairs = "160 pairs, its default" if at["pairs"] == "default" else f"{at['pairs']} pairs"
    intro = ("The same searches' plans re-made with phi at each target, as a user gives it "
             "(`noise_scale=`; `tula-ray replay plan.json --noise-scale`): the reference "
             "recipe (plain SGD at B = 32, which AGS-NS trains there; seed 0; one process) "
             f"trained to {at['window_steps'] // 2} steps before the target's step S0 = E0 x "
             "subset / 32, then `tula_ray.measure_noise_scale(workload, model, steps="
             f"{at['window_steps']})` ({pairs} of 256 samples, spread over {at['window_steps']} "
             "steps of a copy's continuation: one epoch around S0), 3 seeds, their median: "
             f"{_phis(at['phi'])}. Epochs, choices and regrets as above, on `train`'s "
             "clock:\n")
    lines = _searches_report(at["searches"], targets, intro, profiled=False)
    lines += _searches_report(at["iterate_searches"], targets, (
        "The same with phi of the single iterate at S0 (`steps=0`), which moves a lot from "
        f"iterate to iterate: {_phis(at['iterate_phi'])}:\n"), profiled=False)
    trace = at.get("trace")
    if trace:
        lines += ["Cross-check, not used above: `noise-evolution`'s trace of the same recipe "
                  f"(at {trace['commit']}; 32 pairs every quarter epoch), its points within "
                  f"{trace['window_steps']} steps of S0 pooled: " + ", ".join(
                      f"{float(t):.0%}: phi = {_fmt(p['noise_scale'], '.4g')} ({p['points']} "
                      f"points, {p['pairs']} pairs)" for t, p in trace["phi"].items()) + ".", ""]
    return lines


def _searches_report(searches: list[dict], targets: list[str], intro: str,
                     profiled: bool = True) -> list[str]:
    """Each search's plan against the same ground truth: how much of the above is one
    search's luck (its profiled steps and noise scale)."""
    lines = [intro]
    header = ["search", "phi", "profiling wall s"] if profiled else ["search"]
    for target in targets:
        header += [f"{float(target):.0%}: B, regret", "log error", "Spearman"]
    body = []
    for index, found in enumerate(searches):
        row = [index, _fmt(found["noise_scale"], ".4g"),
               _fmt(found["profiling_wall_s"] or math.nan, ".3g")] if profiled else [index]
        for target in targets:
            mine = found["targets"].get(target)
            row += ([f"{mine['global_batch']}, {_regret(mine['regret'])}",
                     _fmt(mine["median_log_error"]), _fmt(mine["spearman"])]
                    if mine else ["n/a"] * 3)
        body.append(row)
    lines += [markdown_table(header, body), ""]
    for target in targets:
        mine = [f["targets"][target] for f in searches if target in f["targets"]]
        if mine:
            lines.append(
                f"- {float(target):.0%}: median over the searches: regret "
                f"{_regret(statistics.median(m['regret'] for m in mine))} (worst "
                f"{_regret(max(m['regret'] for m in mine))}), log error "
                f"{_fmt(statistics.median(m['median_log_error'] for m in mine))}, Spearman "
                f"{_fmt(statistics.median(m['spearman'] for m in mine))}")
    return lines + [""]
