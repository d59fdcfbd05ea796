"""runtime_env (issue 22, item 5): a user's model from a module only the driver has, and an
environment variable it reads, reach the workers of the check, the search's trials and
the training job through `runtime_env`; without it the search fails at once, saying what
is missing. A job's runtime environment is set when its driver connects: each driver here
is a script of its own (a subprocess) joining the run's shared Ray through RAY_ADDRESS,
as `ray job submit` starts one."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tula_ray.cluster import ADDRESS_ENV

pytestmark = pytest.mark.ray

MODULE = "tula_test_driver_only_models"
TIMEOUT_S = 600
# The driver: the model from the module only it has, the data defined in it (travelling to
# the workers by value, as a driver script's do); argv: storage, "with" or "without"
# runtime_env, the module's root. Prints one JSON line of what happened.
DRIVER = textwrap.dedent(f"""\
    import json
    import sys

    import torch
    from torch.utils.data import TensorDataset

    import tula_ray
    from tula_ray.cluster import ray_session
    from tula_ray.failures import UserCodeError
    from tula_ray.workloads import Workload

    storage, mode, root = sys.argv[1:4]
    sys.path.insert(0, root)
    from {MODULE} import Net

    SEARCH = dict(cluster_sizes=(1,), min_batch=32, max_batch=64, warmup_steps=1,
                  measure_steps=2, measure_seconds=0.2, training_strategy=None,
                  objective="time")


    def images():
        generator = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn((256, 3, 8, 8), generator=generator),
                             torch.randint(0, 4, (256,), generator=generator))


    workload = Workload("driver-only", Net, images, images)
    if mode == "without":
        try:
            tula_ray.search(workload, storage_path=storage + "/search", **SEARCH)
        except UserCodeError as error:
            print(json.dumps({{"raised": str(error), "traceback": error.traceback_text}}))
        sys.exit(0)
    runtime_env = {{"py_modules": [root + "/{MODULE}"], "env_vars": {{"TULA_TEST_HIDDEN": "16"}}}}
    with ray_session(runtime_env=runtime_env):  # one Ray job, with its runtime_env
        plan = tula_ray.search(workload, storage_path=storage + "/search",
                               runtime_env=runtime_env, **SEARCH)
        refused = []
        other = {{"env_vars": {{"TULA_TEST_HIDDEN": "8"}}}}
        for entry, arguments in ((tula_ray.search, ()), (tula_ray.train, (plan,))):
            try:
                entry(*arguments, workload=workload, runtime_env=other,
                      storage_path=storage + "/other", **(SEARCH if entry is tula_ray.search
                                                          else {{"epochs": 1}}))
                refused.append("")
            except ValueError as error:
                refused.append(str(error))
    print(json.dumps({{"statuses": plan.table["status"].tolist(), "refused": refused}}))
""")


@pytest.fixture(scope="module")
def driver_only_module(tmp_path_factory):
    """A package on the driver's sys.path only, as a user's own `my_models` would be; its
    model reads an environment variable the driver does not have."""
    root = tmp_path_factory.mktemp("driver_only")
    package = root / MODULE
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("""\
        import os

        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                width = int(os.environ["TULA_TEST_HIDDEN"])  # from runtime_env's env_vars
                self.layers = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, width),
                                            nn.ReLU(), nn.Linear(width, 4))

            def forward(self, inputs):
                return self.layers(inputs)
        """))
    return root


def run_driver(root, tmp_path, mode: str, address: str) -> dict:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    environment = {**os.environ, ADDRESS_ENV: address}
    environment.pop("TULA_TEST_HIDDEN", None)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), mode, str(root)],
                          cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_runtime_env_the_search_says_the_workers_lack_the_module(
        driver_only_module, ray_session, tmp_path):
    """The negative control: the same search, no runtime_env, fails at the check (before
    any trial) and names the remedy."""
    started = time.monotonic()
    outcome = run_driver(driver_only_module, tmp_path, "without", ray_session)
    assert "cannot be rebuilt in a Ray worker" in outcome["raised"]
    assert "py_modules" in outcome["raised"]
    assert f"No module named '{MODULE}'" in outcome["traceback"]
    assert time.monotonic() - started < 60
    assert not (tmp_path / "search").exists()  # no Tune experiment was started


def test_runtime_env_ships_the_module_and_the_variable_to_search_and_train(
        driver_only_module, ray_session, tmp_path):
    """The search's check and trials get the module and the variable (its Ray Train workers
    build the model); so would `train`'s, the same job's. Another runtime_env, which a
    job cannot change once connected, is refused by both entry points before they run."""
    outcome = run_driver(driver_only_module, tmp_path, "with", ray_session)
    assert outcome["statuses"] == ["ok", "ok"]
    assert len(outcome["refused"]) == 2
    assert all("Ray is already initialised in this process with" in refusal
               for refusal in outcome["refused"])
    assert not (tmp_path / "other").exists()
