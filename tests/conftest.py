"""Shared fixtures, the order of the run, and the budget of Ray starts and worker groups.

One local Ray serves every Ray test that does not need its own (`ray_session`, started on
first use, shut down at the end of the run). In one process (`-n 0`) the run is ordered:
the fast tests first, then the tests on the shared Ray, then those that need a Ray of their
own (marked `own_ray`: multi-node clusters, a `ray start` head, `ray up`), which shut the
shared one down before they start theirs, then those that time something (marked `alone`).

Under pytest-xdist (pyproject's addopts: two processes) every Ray test is one
`xdist_group`, queued first: one process runs the Ray tests in that order, while the
other runs the fast tests at Linux's idle priority (SCHED_IDLE), on the CPU time the Ray
tests leave (a third of it: they wait on Ray's starts and ends), so that they slow the Ray
tests as little as the machine allows. Whichever process is done first takes the fast
tests left.

Every Ray this run starts (its own, a subprocess's, a cluster's) keeps its session under
one directory ($RAY_TMPDIR, made here when unset), so the end of the run can count the
Ray starts and Ray Train's worker-group launches from their logs, print both, and fail
the run when a whole run exceeds its budget (DEVELOPERS.md: every CI run pays for them).
"""

import contextlib
import os
import sys
import tempfile
from pathlib import Path

# Ray's token auth makes the dashboard API answer 401 to our test clients; the
# product never changes this for its users, only the test process does.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

import pytest
from hypothesis import settings

from ray_budget import RayBudget

# The fast tests run on the CPU time the Ray tests leave (below): an example's wall time
# says nothing of the code, so no example has a deadline.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

RAY_STARTS_BUDGET = 6
LAUNCHES_BUDGET = 35
# Only a run that includes (almost) every Ray test is held to the budget: a selection
# (`-k`, one file) is not, and neither is `-m "not ray"`.
BUDGET_APPLIES_FROM_RAY_TESTS = 60


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: times something against a ratio bound, so it runs with no other "
        "test beside it at full priority: in the Ray tests' process, after them (the xdist "
        "group below)")
    config.addinivalue_line(
        "markers", "own_ray: needs a Ray of its own (a cluster, a `ray start` head): runs "
        "after every test on the shared Ray, which it shuts down first")
    if "RAY_TMPDIR" not in os.environ:
        # Short: Ray's Unix sockets live under it (at most 107 bytes a path).
        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="tula-tests-", dir="/tmp")
    config.stash[_BUDGET] = RayBudget(Path(os.environ["RAY_TMPDIR"]) / "ray")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two processes of torch's 2 threads each on 2 cores spin against each other: the
        # fast tests took 30 % more CPU time so. Ray's workers set their own threads.
        import torch
        torch.set_num_threads(1)


_BUDGET = pytest.StashKey[RayBudget]()


def _phase(item: pytest.Item) -> int:
    """0: no Ray; 1: the shared Ray; 2: a Ray of its own; 3: a test that must run alone."""
    if item.get_closest_marker("alone"):
        return 3
    if item.get_closest_marker("own_ray"):
        return 2
    return 1 if item.get_closest_marker("ray") else 0


# The xdist group of every Ray test (and every `alone` one): one process runs them all, in
# the run's order.
RAY_GROUP = "ray"


def _queued(config: pytest.Config):
    """The run's order: in one process the fast tests first (a broken core fails fast);
    under xdist's loadgroup the Ray group first, so that it goes to one process at once
    and the fast tests to the other."""
    if getattr(config.option, "loadgroup", False):
        return lambda item: (_phase(item) == 0, _phase(item))
    return _phase


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: each phase keeps the files' and the tests' own order.
    items.sort(key=_queued(config))
    config.stash[_RAY_TESTS] = sum(1 for item in items if _phase(item))
    for item in items:
        if _phase(item):
            item.add_marker(pytest.mark.xdist_group(RAY_GROUP))


_RAY_TESTS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under xdist's loadgroup, every Ray test carries its group in its id, or the run stops
    here: without it the Ray tests would run on both processes, two Rays at once."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if _phase(item) and not item.nodeid.endswith("@" + RAY_GROUP)]
    if lost:
        message = (f"pytest-xdist did not group {len(lost)} Ray tests (e.g. {lost[0]}): this "
                   "pytest and pytest-xdist do not keep xdist_group (pytest-xdist issue "
                   "1386); install the test extra's pins, or run with -n 0")
        print(message, file=sys.__stderr__, flush=True)  # a worker's error shows no text
        raise pytest.UsageError(message)


def _yield_the_cpus_if_first_is_fast(item: pytest.Item) -> None:
    """An xdist process whose first test is a fast one runs every test at idle priority
    (children included): the other process has the Ray group, whose worker groups then
    take both cores whenever they ask. Not nice 19: Ray runs its workers at nice 15 (its
    `worker_niceness`), beside which nice 19 still takes nearly a third of a core they
    want (CFS weights 15 against 36; SCHED_IDLE's is 3). Only Linux has SCHED_IDLE;
    elsewhere, or where it is refused, nice 19.
    A Ray test in that process would start a Ray at idle priority beside full-priority
    fast tests, the very starving of worker groups this layout avoids: the run stops."""
    global _IDLE
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if _IDLE is None:
        _IDLE = not _phase(item)
        if not _IDLE:
            return
        try:  # a container's seccomp may refuse a policy: then nice, else as it is
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            with contextlib.suppress(OSError):
                os.nice(19)
    elif _IDLE and _phase(item):
        message = (f"{item.nodeid} reached the process that runs the fast tests at idle "
                   "priority: the Ray group was not queued first (tests/conftest.py)")
        print(message, file=sys.__stderr__, flush=True)
        raise pytest.UsageError(message)


_IDLE: bool | None = None  # this process: undecided until its first test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Each Ray test's launches (its fixtures' included: they count where first set up)."""
    _yield_the_cpus_if_first_is_fast(item)
    budget = item.config.stash[_BUDGET]
    if _phase(item):
        budget.count()
        before = budget.launches
        yield
        budget.count()
        if budget.launches > before:
            budget.by_test[item.nodeid.removesuffix("@" + RAY_GROUP)] = budget.launches - before
    else:
        yield


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """An xdist process's share (xdist's controller): the Ray tests it collected, and the
    launches of the tests it ran (the Ray starts and launches are counted from disk)."""
    share = getattr(node, "workeroutput", {}).get("ray_budget")
    if share:
        config = node.config
        config.stash[_RAY_TESTS] = max(config.stash.get(_RAY_TESTS, 0), share["ray_tests"])
        config.stash[_BUDGET].by_test.update(share["by_test"])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    budget = config.stash[_BUDGET]
    if hasattr(config, "workeroutput"):  # an xdist process: its controller sums up
        config.workeroutput["ray_budget"] = {"ray_tests": config.stash.get(_RAY_TESTS, 0),
                                             "by_test": budget.by_test}
        return
    budget.count()
    if (config.stash.get(_RAY_TESTS, 0) >= BUDGET_APPLIES_FROM_RAY_TESTS
            and budget.exceeded(RAY_STARTS_BUDGET, LAUNCHES_BUDGET)
            and session.exitstatus == 0):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workeroutput"):
        return
    budget = config.stash[_BUDGET]
    applies = config.stash.get(_RAY_TESTS, 0) >= BUDGET_APPLIES_FROM_RAY_TESTS
    terminalreporter.section("Ray starts and worker-group launches")
    for line in budget.report(RAY_STARTS_BUDGET, LAUNCHES_BUDGET, applies):
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def ray_session():
    """The run's one local Ray (the product's own local start, on loopback) with 2 CPUs, so
    that no test depends on the machine's core count; yields its GCS address, for a
    subprocess that should join it (RAY_ADDRESS) rather than start its own. Shut down at
    the end of the run, or by the first `own_ray` module (they run last)."""
    import ray

    from tula_ray.cluster import start_local_ray

    start_local_ray(num_cpus=2)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


# How long the shared Ray's CPUs may stay taken after a test: Ray Train and Tune end
# their actors a moment after `fit` returns (a second or two here, alone), longer on a
# loaded machine; only a test that left something behind waits it out.
LEFTOVER_WAIT_S = 120.0


@pytest.fixture(autouse=True)
def ray_leftovers(request: pytest.FixtureRequest):
    """After each test on the shared Ray: its CPUs are all free again, or the test fails
    naming what still held them (killed and removed here), instead of every later test
    waiting for them until CI's own timeout (`ray_leftovers.release_leftovers`)."""
    yield
    if "ray_session" not in request.fixturenames:
        return
    import ray

    from ray_leftovers import release_leftovers

    if not ray.is_initialized():
        return
    held = release_leftovers(LEFTOVER_WAIT_S)
    if held:
        pytest.fail(f"{request.node.nodeid} left the shared Ray's CPUs taken "
                    f"{LEFTOVER_WAIT_S:.0f} s after it ended, by: " + "; ".join(held))


@pytest.fixture(scope="session")
def readme_driver(ray_session, tmp_path_factory):
    """README's driver (its one `<!-- ray -->` block), run once as printed, on the shared
    Ray, in an empty working directory: its namespace (plan, result, workload), what it
    printed, and that directory. Ray's default storage (~/ray_results) it wrote to is
    removed afterwards (its runs' names start with the workload's)."""
    import contextlib
    import io
    import shutil
    import time

    from docs_blocks import RAY_BLOCKS, run_block

    (block,) = RAY_BLOCKS
    cwd = tmp_path_factory.mktemp("readme-driver")
    started, printed = time.time(), io.StringIO()
    here = os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(printed):
            namespace = run_block(block, by_value=True)
        os.chdir(here)
        yield {"namespace": namespace, "printed": printed.getvalue(), "cwd": cwd}
    finally:
        os.chdir(here)
        results = Path("~/ray_results").expanduser()
        for path in results.glob("tula-*my-cnn-*") if results.is_dir() else []:
            if path.stat().st_mtime >= started - 1:
                shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def no_shared_ray():
    """For a module with a Ray of its own: the shared Ray is shut down first (its tests
    have all run: `own_ray` tests run last)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield


@pytest.fixture
def registries():
    """Every registry as it was before the test afterwards, and the extension modules
    forgotten, so that each test adds its extension itself."""
    from tula_ray.models import compute_forms, pricing
    from tula_ray.planning import search_strategies
    from tula_ray.training import strategies
    from tula_ray.workloads import workload

    saved = [(registry, dict(registry)) for registry in (
        search_strategies.SEARCH_STRATEGIES, strategies.TRAINING_STRATEGIES, pricing.PRICINGS,
        compute_forms.COMPUTE_FORMS, workload.WORKLOADS)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)
    from extension_registries import FILES

    for name in FILES:
        sys.modules.pop(name, None)
