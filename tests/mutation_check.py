"""Mutation check of the fast tests: break one equation at a time, see a fast test fail.

    .venv/bin/python tests/mutation_check.py [--only NAME ...] [--list] [--discover]

Each mutation replaces exact snippets of a core module (each must occur exactly once, or
the mutation is STALE: update the snippet to the current code) in a scratch copy of the
working tree, then runs the few fast (not Ray) tests named to catch it, stopping at the
first failure. A mutation is CAUGHT when one of them fails, MISSED when all pass, an
ERROR when pytest could not run them (a node id not found, a collection error, a
timeout), or when the test that caught it fails without the mutation too (every test that
caught one runs once more, unmutated, at the end).

Fast: the scratch copy is made once, and the runs are forked from one server process
that imported the heavy libraries (numpy, pandas, scipy, torch, ...) once; only the
project's own modules and the tests are imported afresh, mutated, in each run.
`tests/test_mutations.py` runs this in the suite and checks that `MUTATIONS` cover every
equation of `EQUATIONS`.

--discover runs each mutation against the whole test files of its node ids (no -x) and
lists every test that fails with it: where to pick the fastest catcher from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
# unraisableexception: its gc.collect at exit takes ~0.3 s per run with torch loaded; the
# rewrite warning says the fork server imported hypothesis (a plugin) before pytest started.
# -n 0: each run in its own (forked) process, not pyproject's two xdist processes.
PYTEST_ARGS = ("-m", "not ray", "-q", "-n", "0", "-p", "no:cacheprovider",
               "-p", "no:unraisableexception", "-W", "ignore::pytest.PytestAssertRewriteWarning")
TIMEOUT_S_DEFAULT = 120.0  # one mutation's run; a hang (a mutated loop) is an ERROR
# Third-party modules the tests import, loaded once by the fork server (never the
# project's own: those are imported afresh, mutated, in every run).
PRELOAD = ("numpy", "pandas", "scipy.optimize", "scipy.interpolate", "torch", "hypothesis",
           "kneed", "pytest", "_pytest.python")
WRONG_TREE_RC = 99  # a run imported tula_ray from outside the scratch copy
UNSOUND = "fails without the mutation too"  # a catching test that catches nothing

# What the mutations must cover, each at least once: the paper's equations (§III) and the
# model's forms beyond them. tests/test_mutations.py checks the tags equal this set.
EQUATIONS = {
    "eq. 2a": "step time = compute + sync",
    "eq. 2b": "compute time of a step against the local batch b",
    "eq. 2c ring": "sync time of ring all-reduce, units 1 - 1/N",
    "eq. 2c ps": "sync time of a parameter server, units N",
    "eq. 3": "peak memory = static + per-sample bytes x b",
    "eq. 4a": "training time = E x floor(D / B) x t_step (whole steps, as `train` takes them)",
    "eq. 4b": "cost = T x N x price per node-hour, N the nodes billed (whole, ceil(N / G))",
    "eq. 5": "AGS gradient variability |(|G_i|^2 - |G_i-1|^2) / |G_i-1|^2|",
    "overlap": "AdaptDL's p-norm overlap of compute and sync",
    "log2 N": "compute interpolated in log2(N) between profiled cluster sizes",
    "knee": "Kneedle's knee of the time curve over log2(B)",
}
BEYOND = "beyond the paper"  # the tag of a mutation of the code around the equations


@dataclass(frozen=True)
class Mutation:
    name: str  # what is broken
    equation: str  # a key of EQUATIONS, or BEYOND
    path: str  # file, relative to the repository root
    edits: tuple[tuple[str, str], ...]  # (exact snippet, occurring once; what it becomes)
    tests: tuple[str, ...]  # fast test node ids that should catch it, fastest first


def mutation(name: str, equation: str, path: str, old: str, new: str, tests: tuple[str, ...],
             also: tuple[tuple[str, str], ...] = ()) -> Mutation:
    """A Mutation replacing `old` by `new` in `path` (and each pair of `also` there too)."""
    return Mutation(name, equation, path, ((old, new), *also), tests)


PERF, SYNC, FORMS = "tula_ray/models/perf.py", "tula_ray/models/sync_levels.py", \
    "tula_ray/models/compute_forms.py"
MEMORY, PRICING = "tula_ray/models/memory.py", "tula_ray/models/pricing.py"
AGS, POLICY = "tula_ray/ags/equations.py", "tula_ray/planning/policy.py"
ESTIMATES = "tula_ray/planning/estimates.py"
T_PERF, T_FORMS, T_MEMORY = "tests/test_perf.py::", "tests/test_compute_forms.py::", \
    "tests/test_memory.py::"
T_PRICING, T_AGS, T_PLAN = "tests/test_pricing.py::", "tests/test_ags.py::", \
    "tests/test_plan.py::"
T_POLICY = "tests/test_policy.py::"

MUTATIONS = (
    mutation("eq. 2a: step = compute - sync", "eq. 2a", PERF,
             "        return compute_s + sync_s", "        return compute_s - sync_s",
             (T_PERF + "test_the_overlap_form_is_the_p_norm_by_hand",
              T_PERF + "test_two_diagonal_profiles_identify_a_pooled_model")),
    mutation("eq. 2b: compute per sample doubled", "eq. 2b", FORMS,
             "self.per_sample_s * np.asarray(local_batch, float) ** self.exponent",
             "2 * self.per_sample_s * np.asarray(local_batch, float) ** self.exponent",
             (T_PERF + "test_convex_compute_takes_the_power_form",
              T_PLAN + "test_times_and_costs_are_the_papers_equations_on_exact_profiles")),
    mutation("eq. 2b: convex data kept as a line (a negative fixed cost)", "eq. 2b", FORMS,
             "    if intercept < 0 or slope < 0:\n        return None",
             "    if False:\n        return None",
             (T_PERF + "test_convex_compute_takes_the_power_form",
              T_FORMS + "test_built_in_forms_in_order_line_then_power_then_constant")),
    mutation("eq. 2b per N: one compute curve pooled over every N", "eq. 2b", PERF,
             '        if group["local_batch"].nunique() >= 2\n',
             '        if group["local_batch"].nunique() >= 2 and False\n',
             (T_PERF + "test_exact_linear_data_give_the_papers_line",)),
    mutation("eq. 2c: ring units 1 - 1/N -> 1 - 2/N", "eq. 2c ring", SYNC,
             "    return 1.0 - 1.0 / n", "    return 1.0 - 2.0 / n",
             (T_PERF + "test_sync_shapes_of_eq_2c",)),
    mutation("eq. 2c: parameter server units N -> N - 1", "eq. 2c ps", SYNC,
             "    return np.where(n > 1, n, 0.0)", "    return np.where(n > 1, n - 1, 0.0)",
             (T_PERF + "test_sync_shapes_of_eq_2c",
              T_PERF + "test_parameter_server_model_is_recovered")),
    mutation("eq. 2c overlap: exposed sync allowed below 0", BEYOND, SYNC,
             "return np.maximum(np.asarray(level_s, dtype=float) + change, 0.0)",
             "return np.asarray(level_s, dtype=float) + change",
             (T_PERF
              + "test_an_exposed_sync_that_falls_with_the_backward_is_fitted_and_never_negative",)),
    mutation("overlap form: exponent 1/p -> 1/(p + 0.5)", "overlap", PERF,
             "** (1.0 / overlap_p)", "** (1.0 / (overlap_p + 0.5))",
             (T_PERF + "test_the_overlap_form_is_the_p_norm_by_hand",)),
    mutation("interpolation in N instead of log2(N)", "log2 N", PERF,
             "x, xk = np.log2(n), np.log2(known)", "x, xk = n, known",
             (T_PERF + "test_compute_between_profiled_cluster_sizes_is_interpolated_in_log2_n",)),
    mutation("eq. 4a: steps per epoch rounded up (train takes floor(D / B) whole steps)",
             "eq. 4a", PERF,
             "return np.maximum(np.floor(steps), 1.0) if whole_steps",
             "return np.maximum(np.ceil(steps), 1.0) if whole_steps",
             (T_PERF + "test_training_time_eq_4a",
              T_PLAN + "test_times_and_costs_are_the_papers_equations_on_exact_profiles")),
    mutation("eq. 4a: the knee's dense curve rounded to whole steps too", "eq. 4a", PERF,
             "np.maximum(np.floor(steps), 1.0) if whole_steps else steps",
             "np.maximum(np.floor(steps), 1.0)",
             (T_PLAN + "test_the_knee_does_not_depend_on_rounding_steps_per_epoch[3333]",)),
    mutation("eq. 4a: training time without the epochs", "eq. 4a", PERF,
             "    return epochs * steps_per_epoch(", "    return steps_per_epoch(",
             (T_PERF + "test_training_time_eq_4a",)),
    mutation("eq. 4b: cost without N", "eq. 4b", PRICING,
             "return hours * np.asarray(num_nodes, dtype=float) * usd_per_node_hour",
             "return hours * usd_per_node_hour",
             (T_PRICING + "test_fixed_rate_eq_4b",)),
    mutation("eq. 4b: a node billed by its workers' share, not whole", "eq. 4b", PRICING,
             "return share if shared_nodes else np.ceil(share)", "return share",
             (T_PRICING + "test_a_node_is_billed_whole[pricing0]",)),
    mutation("eq. 3: batch term dropped from the prediction", "eq. 3", MEMORY,
             "return params.static_bytes + params.overhead_bytes + params.bytes_per_sample * b",
             "return params.static_bytes + params.overhead_bytes + 0 * b",
             (T_MEMORY + "test_linear_peaks_are_fitted_exactly",)),
    mutation("eq. 3 bound: off by one above the limit", "eq. 3", MEMORY,
             "    while line_peak_bytes(params, b + 1) <= limit:\n        b += 1\n"
             "    return max(b, 0)",
             "    while line_peak_bytes(params, b + 1) <= limit:\n        b += 1\n"
             "    return max(b + 1, 0)",
             (T_MEMORY + "test_max_local_batch_is_exact_on_linear_data",)),
    mutation("eq. 3 bound: verified bound is the largest checked batch, fitting or not",
             BEYOND, MEMORY,
             "return max((b for b, p in peaks.items() if p is not None and p <= limit), "
             "default=0), checks",
             "return max((b for b, p in peaks.items() if p is not None), default=0), checks",
             (T_MEMORY + "test_the_check_pulls_an_overshooting_bound_under_the_device",)),
    mutation("eq. 5: variability without the absolute value", "eq. 5", AGS,
             "return abs((norm_sq - previous_norm_sq) / previous_norm_sq)",
             "return (norm_sq - previous_norm_sq) / previous_norm_sq",
             (T_AGS + "test_gradient_variability_is_eq5",)),
    mutation("knee: Kneedle on B instead of log2(B)", "knee", POLICY,
             "    x = np.log2(np.asarray(global_batch, dtype=float))",
             "    x = np.asarray(global_batch, dtype=float)",
             (T_PLAN + "test_the_plans_knee_is_kneedles_on_log2_b_of_the_predicted_time",
              T_POLICY + "test_knee_is_kneedles_on_the_dense_curve"),
             also=(("return float(2.0 ** locator.x[int(np.argmax(locator.y_difference))])",
                    "return float(locator.x[int(np.argmax(locator.y_difference))])"),)),
    mutation("knee: Kneedle's first knee instead of its most pronounced", "knee", POLICY,
             "return float(2.0 ** locator.x[int(np.argmax(locator.y_difference))])",
             "return float(2.0 ** locator.knee)",
             (T_POLICY + "test_the_knee_is_the_most_pronounced_of_kneedles_knees",)),
    mutation("knee curve: measured ratio interpolated in B, not log2(B)", "knee", ESTIMATES,
             'factor = np.exp(np.interp(x, np.log2(rows["global_batch"].to_numpy(float)), '
             'ratio))',
             'factor = np.exp(np.interp(2 ** x, rows["global_batch"].to_numpy(float), ratio))',
             (T_PLAN + "test_the_dense_curve_passes_through_the_measurements_and_keeps_the_"
              "models_shape",)),
    mutation("estimates: a measured candidate judged by its prediction", BEYOND, ESTIMATES,
             'time_s = np.where(measured, table["measured_total_time_s"], table["total_time_s"])',
             'time_s = np.where(False, table["measured_total_time_s"], table["total_time_s"])',
             (T_PLAN + "test_a_measured_candidate_is_chosen_on_its_measurement_not_its_"
              "prediction",)),
)


@dataclass(frozen=True)
class Result:
    name: str
    outcome: str  # "caught" | "missed" | "stale" | "error"
    seconds: float
    caught_by: str = ""  # the node id that failed
    detail: str = ""  # why stale, missed or an error: what to update


# --- checking a mutation against the code, without running anything ----------------------

def stale_reasons(mutation: Mutation, root: Path = ROOT) -> list[str]:
    """Why `mutation` no longer fits the code at `root` (empty when it does): a snippet not
    found exactly once, a mutated file that does not compile, a test node id whose file
    or function is gone."""
    path = root / mutation.path
    where = f"mutation {mutation.name!r} ({mutation.path})"
    if not path.is_file():
        return [f"{where}: the file is gone; point the mutation at the module that now holds "
                "the code"]
    text = path.read_text()
    reasons = [f"{where}: snippet {old!r} occurs {text.count(old)} times, must occur once; "
               "update it to the current code" for old, _ in mutation.edits
               if text.count(old) != 1]
    if not reasons:
        try:
            compile(apply(mutation, text), str(path), "exec")
        except SyntaxError as error:
            reasons.append(f"{where}: the mutated file does not compile ({error}); fix the "
                           "replacement text")
    if not mutation.tests:
        reasons.append(f"{where}: names no test to catch it")
    for node in mutation.tests:
        file, _, function = node.partition("::")
        function = function.split("[")[0].split("::")[-1]
        test_path = root / file
        if not test_path.is_file() or not re.search(rf"^\s*def {re.escape(function)}\(",
                                                    test_path.read_text(), re.MULTILINE):
            reasons.append(f"{where}: test {node} is gone; name the test that now covers it")
    return reasons


def apply(mutation: Mutation, text: str) -> str:
    for old, new in mutation.edits:
        text = text.replace(old, new, 1)
    return text


def scratch_copy(destination: Path, root: Path = ROOT) -> None:
    """The tracked and untracked files of the working tree (uncommitted edits included),
    no .venv or .git; outside a git checkout, the whole tree but those."""
    try:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"],
                               cwd=root, capture_output=True, text=True,
                               check=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(root, destination, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info"))
        return
    for name in filter(None, files):
        source = root / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


# --- running pytest in the scratch copy -----------------------------------------------------

def _environment(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTHONPATH")}
    env["PYTHONPATH"] = str(scratch)
    return env


class ForkServer:
    """A process in the scratch copy that imported PRELOAD once and forks one child per
    pytest run: the child imports the project afresh, from the (mutated) scratch files."""

    def __init__(self, scratch: Path):
        self.log = scratch / ".mutation-run.log"
        self.process = subprocess.Popen(
            [sys.executable, str(scratch / "tests" / "mutation_check.py"), "--serve"],
            cwd=scratch, env=_environment(scratch), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True)
        if not self.process.stdout.readline():  # PRELOAD imported: the runs' time is theirs
            raise RuntimeError(f"the mutation fork server died (exit {self.process.poll()})")

    def run(self, args: list[str], timeout_s: float) -> tuple[int, str]:
        request = {"args": args, "log": str(self.log), "timeout_s": timeout_s}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the mutation fork server died (exit {self.process.poll()})")
        return json.loads(answer)["rc"], self.log.read_text(errors="replace")

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


class SubprocessRunner:
    """One `python -m pytest` per run: where os.fork is missing, or with --no-fork."""

    def __init__(self, scratch: Path):
        self.scratch = scratch

    def run(self, args: list[str], timeout_s: float) -> tuple[int, str]:
        try:
            result = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=self.scratch,
                                    env=_environment(self.scratch), capture_output=True,
                                    text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as expired:
            return -signal.SIGALRM, str(expired.stdout or "")
        return result.returncode, result.stdout + result.stderr

    def close(self) -> None:
        pass


@contextmanager
def scratch_runner(fork: bool = True) -> Iterator[tuple[Path, ForkServer | SubprocessRunner]]:
    """A scratch copy of the working tree and a runner of pytest in it; both gone after."""
    with tempfile.TemporaryDirectory(prefix="tula-mutation-") as directory:
        scratch = Path(directory)
        scratch_copy(scratch)
        runner = (ForkServer if fork and hasattr(os, "fork") else SubprocessRunner)(scratch)
        try:
            yield scratch, runner
        finally:
            runner.close()


def serve() -> None:
    """The fork server's loop (`--serve`, run with the scratch copy as working directory):
    one JSON request per line in, one {"rc": exit status} per line out."""
    scratch = Path.cwd().resolve()
    sys.path[0] = str(scratch)  # not tests/: pytest puts the scratch tests/ there itself
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, scratch)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


def _child(request: dict, scratch: Path) -> None:
    """Run pytest on the request's arguments with output to its log; never returns."""
    rc = 3
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        signal.alarm(max(1, int(request["timeout_s"])))
        import pytest

        rc = int(pytest.main(request["args"]))
        module = sys.modules.get("tula_ray")
        if module is not None and not Path(module.__file__).resolve().is_relative_to(scratch):
            print(f"tula_ray was imported from {module.__file__}, not the scratch copy")
            rc = WRONG_TREE_RC
    except BaseException:  # noqa: BLE001 - the child reports whatever stopped it
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


# --- the check ------------------------------------------------------------------------------

def _failed_nodes(output: str) -> list[str]:
    """The node ids pytest's short summary (-ra) lists as FAILED or ERROR."""
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)


def _why(rc: int, output: str) -> str:
    if rc == -signal.SIGALRM:
        return "timed out"
    if rc == WRONG_TREE_RC:
        return "tested the working tree instead of the scratch copy"
    return f"pytest exit {rc}: " + " | ".join(output.strip().splitlines()[-4:])


def run_one(mutation: Mutation, scratch: Path, runner, timeout_s: float = TIMEOUT_S_DEFAULT
            ) -> Result:
    """Apply `mutation` to the scratch copy, run its tests (-x), restore the file."""
    reasons = stale_reasons(mutation, scratch)
    if reasons:
        return Result(mutation.name, "stale", 0.0, detail="; ".join(reasons))
    path = scratch / mutation.path
    original = path.read_text()
    path.write_text(apply(mutation, original))
    started = time.perf_counter()
    try:
        rc, output = runner.run([*PYTEST_ARGS, "-x", *mutation.tests], timeout_s)
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - started
    if rc == 0:
        return Result(mutation.name, "missed", seconds,
                      detail=f"{list(mutation.tests)} all pass with it: sharpen one")
    if rc == 1:
        failed = _failed_nodes(output)
        return Result(mutation.name, "caught", seconds, caught_by=failed[0] if failed else "")
    return Result(mutation.name, "error", seconds, detail=_why(rc, output))


def confirm(results: list[Result], runner, timeout_s: float = TIMEOUT_S_DEFAULT
            ) -> tuple[list[Result], float]:
    """Run the tests that caught a mutation once more, unmutated: one that fails there too
    caught nothing, and its mutations become errors. Returns the results and the seconds."""
    nodes = list(dict.fromkeys(r.caught_by for r in results if r.outcome == "caught"))
    if not nodes:
        return results, 0.0
    started = time.perf_counter()
    rc, output = runner.run([*PYTEST_ARGS, *nodes], timeout_s * 2)
    seconds = time.perf_counter() - started
    if rc == 0:
        return results, seconds
    failing, why = set(_failed_nodes(output)), _why(rc, output)
    return [replace(r, outcome="error", detail=f"{r.caught_by} {UNSOUND} ({why})")
            if r.outcome == "caught" and (r.caught_by in failing or not failing) else r
            for r in results], seconds


def check(mutations=MUTATIONS, *, fork: bool = True, timeout_s: float = TIMEOUT_S_DEFAULT,
          report: Callable[[str], None] = lambda line: None) -> tuple[list[Result], float]:
    """Every mutation's Result, and the total seconds (scratch copy and confirmation run
    included). report(line) is called as each result comes (the script prints them)."""
    started = time.perf_counter()
    with scratch_runner(fork) as (scratch, runner):
        results = []
        for one in mutations:
            results.append(run_one(one, scratch, runner, timeout_s))
            report(format_result(results[-1]))
        results, seconds = confirm(results, runner, timeout_s)
        unsound = [r.detail for r in results if UNSOUND in r.detail]
        report(f"{'confirm':7s} {seconds:6.1f} s  "
               + ("; ".join(unsound) or "the catching tests pass without the mutations"))
    return results, time.perf_counter() - started


def format_result(result: Result) -> str:
    why = result.caught_by if result.outcome == "caught" else result.detail
    return f"{result.outcome:7s} {result.seconds:6.1f} s  {result.name}  [{why}]"


def discover(mutations, *, fork: bool = True, timeout_s: float = TIMEOUT_S_DEFAULT) -> None:
    """Print, per mutation, every test of its named test files that fails with it, with
    the seconds it took."""
    with scratch_runner(fork) as (scratch, runner):
        for one in mutations:
            if stale_reasons(one, scratch):
                print(f"stale: {one.name}", flush=True)
                continue
            files = sorted({node.partition("::")[0] for node in one.tests})
            path = scratch / one.path
            original = path.read_text()
            path.write_text(apply(one, original))
            try:
                rc, output = runner.run([*PYTEST_ARGS, "--durations=0", *files], timeout_s * 5)
            finally:
                path.write_text(original)
            print(f"{one.name}: pytest exit {rc}", flush=True)
            for node in _failed_nodes(output):
                took = re.findall(rf"^([\d.]+)s call\s+{re.escape(node)}$", output,
                                  re.MULTILINE)
                print(f"    {node}  {took[0] + ' s' if took else ''}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="substrings of mutation names")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--discover", action="store_true",
                        help="list every test of the named files that catches each mutation")
    parser.add_argument("--no-fork", action="store_true", help="one pytest process per run")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S_DEFAULT,
                        help="seconds one mutation's run may take")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    chosen = [m for m in MUTATIONS if not args.only or any(s in m.name for s in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.equation:16s} {m.name}  ({m.path})")
        return 0
    if args.discover:
        discover(chosen, fork=not args.no_fork, timeout_s=args.timeout)
        return 0
    results, seconds = check(chosen, fork=not args.no_fork, timeout_s=args.timeout,
                             report=lambda line: print(line, flush=True))
    bad = [r.name for r in results if r.outcome != "caught"]
    print(f"{len(results) - len(bad)} of {len(results)} mutations caught in {seconds:.1f} s"
          + (f"; not caught: {bad}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
