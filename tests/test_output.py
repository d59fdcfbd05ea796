"""What a run prints (issue 41, item 5), without Ray: the search's progress lines (the Tune
callback driven by hand, as tests/test_searcher.py drives the searcher), the wrapping every
line goes through, and the plan's summary in 100 columns."""

from types import SimpleNamespace

import pytest
from paper_profiles import paper_profiles

from searchers import TulaSearcher
from searchers.search_progress import SearchProgress, candidate_line, launch_line
from tula_ray.planning.plan import build_plan
from tula_ray.planning.synthetic import example_params
from tula_ray.space import SearchSpace, corners
from tula_ray.verbosity import LINE_WIDTH, check_verbose, wrap

# build_plan's former keywords, which still work (tests/test_plan_context.py checks their
# warning and that they build the same plan as a PlanContext)
pytestmark = pytest.mark.filterwarnings("ignore:build_plan's keywords:FutureWarning")

SPACE = SearchSpace.build((1, 2), min_batch=32, max_batch=256)


def row(n, b, **fields):
    return {"num_workers": n, "global_batch": b, "local_batch": b // n, "status": "ok",
            "failure": "", "error": "", "step_time_s": 0.0281, **fields}


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_a_search_prints_a_line_per_launch_and_one_per_candidate(capsys):
    """Tune's order: the searcher sees a result first, then the callback; a failed group's
    re-reported batch prints once; verbose 0 prints nothing."""
    searcher = TulaSearcher(SPACE.candidates(), "full")
    progress = SearchProgress(searcher, verbose=1)
    config = searcher.suggest("t0")
    trial = SimpleNamespace(config=config, trial_id="t0")
    progress.on_trial_start(0, [trial], trial)
    for b in config["global_batches"][:2]:
        searcher.on_trial_result("t0", row(1, b))
        progress.on_trial_result(0, [trial], trial, row(1, b))
    progress.on_trial_result(0, [trial], trial, row(1, 32))  # re-reported: not again
    progress.on_trial_result(0, [trial], trial, {"launch_total_s": 30.0})  # not a candidate
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "N=1, round 1: a worker group for B = 32, 64, 128, 256 (0 candidates done, 8 left)",
        "  [1/8] N=1 B=32 (b=32): step 28.1 ms",
        "  [2/8] N=1 B=64 (b=64): step 28.1 ms"]

    quiet = SearchProgress(searcher, verbose=0)
    quiet.on_trial_start(0, [trial], trial)
    quiet.on_trial_result(0, [trial], trial, row(1, 128))
    assert capsys.readouterr().out == ""


def test_a_failed_candidate_is_one_line_of_at_most_100_characters():
    failed = row(2, 4096, status="oom", failure="oom", step_time_s=float("nan"),
                 error="RuntimeError: CUDA out of memory. " + "Tried to allocate 2 GiB " * 20)
    line = candidate_line(failed, 3, 1)
    assert line.startswith("  [3/4] N=2 B=4096 (b=2048): oom (oom): RuntimeError: CUDA out")
    assert len(line) <= LINE_WIDTH and "\n" not in line
    assert launch_line({"num_workers": 4, "round": 2, "global_batches": [64, 128]}, 5, 2) == (
        "N=4, round 2: a worker group for B = 64, 128 (5 candidates done, 2 left)")


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_the_levels_are_0_1_2(verbose):
    assert check_verbose(verbose) == verbose


@pytest.mark.parametrize("bad, error", [(3, ValueError), (-1, ValueError), (True, TypeError),
                                        ("2", TypeError)])
def test_another_level_is_refused_naming_it_and_the_levels(bad, error):
    with pytest.raises(error, match=r"verbose=.*in \[0, 2\].*0: errors and warnings only"):
        check_verbose(bad)


def test_wrapping_keeps_every_word_and_cuts_a_long_url_after_a_slash():
    text = ("Fashion-MNIST: /root/.cache/tula-ray/fashion-mnist/FashionMNIST/raw (downloaded "
            "from https://deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/"
            "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb on 2026-11-27)\nshort")
    wrapped = wrap(text)
    assert widest(wrapped) <= LINE_WIDTH
    assert "".join(wrapped.split()) == "".join(text.split())
    lines = wrapped.splitlines()
    assert lines[1] == "    deb.debian.org/debian/pool/main/d/dataset-fashion-mnist/"
    assert lines[-1] == "short"
    assert wrap("  [1/6] " + "word " * 30).splitlines()[1].startswith("    word")


def big_plan(**options):
    """A plan of 4 x 8 candidates, built offline (as tests/test_plan.py builds plans)."""
    space = SearchSpace.build((1, 2, 4, 8), min_batch=32, max_batch=4096)
    profiles = paper_profiles(corners(space.candidates()), example_params(), seed=2)
    return build_plan(space, profiles, epochs=5, dataset_size=60000, search_strategy="partial",
                      **options)


@pytest.mark.parametrize("objective", ["knee", "cost", "time_to_accuracy"])
def test_the_summary_fits_in_100_columns_and_shows_the_rows_that_matter(objective):
    plan = big_plan(objective=objective)
    text = plan.summary()
    assert widest(text) <= LINE_WIDTH
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if "candidates shown" in line)
    header, *shown = lines[:end]
    assert header.split() == ["N", "B", "b", "step_ms", "epoch_s", "total_s", "target_s",
                              "cost_usd", "peak_MiB", "from", "note"]
    choice = plan.choice
    pairs = {(int(line.split()[0]), int(line.split()[1])) for line in shown}
    assert (choice.num_workers, choice.global_batch) in pairs and set(choice.ties) <= pairs
    assert {n for n, _ in pairs} == {1, 2, 4, 8}  # the best of each N
    assert len(shown) < len(plan.table)
    assert f"{len(shown)} of {len(plan.table)} candidates shown" in text
    assert any(line.rstrip().endswith("choice") for line in shown)

    everything = plan.summary(all_rows=True)
    assert widest(everything) <= LINE_WIDTH and "candidates shown" not in everything
    assert len(plan.table.columns) > 30  # the full table is in the plan, unchanged


def test_trains_line_per_epoch_names_its_loss_accuracy_and_seconds():
    from trainables.training_loop import epoch_line

    row = {"epoch": 2, "train_loss": 0.41234, "test_accuracy": 0.87123, "seconds": 12.34}
    assert epoch_line(row, 20) == "epoch 3 of 20: train loss 0.4123, test accuracy 0.8712, 12.3 s"
    tuning = {"epoch": 0, "train_loss": 1.0, "val_accuracy": 0.5}
    assert epoch_line(tuning, None) == "epoch 1: train loss 1, val accuracy 0.5000"
    to_target = {"epoch": 1, "train_loss": 0.5, "val_accuracy": 0.9, "test_accuracy": float("nan"),
                 "target_accuracy": 0.85, "target_reached": True, "seconds": 2.0}
    assert epoch_line(to_target, 5) == ("epoch 2 of 5: train loss 0.5, val accuracy 0.9000 "
                                        "(target 0.8500: reached), 2.0 s")


def test_the_output_benchmark_counts_lines_the_widest_and_rays_own():
    from benchmarks.startup.demo_output import measure

    printed = "Ray dashboard: http://127.0.0.1:8265\n" + "x" * 120 + "\n(RayTrainWorker pid=7) hi\n"
    figures = measure(printed)
    assert (figures["lines"], figures["widest"], figures["lines_over_width"],
            figures["ray_process_lines"]) == (3, 120, 1, 1)
