"""runtime_env (issue 22, item 5): a user's model from a module only the driver has, and an
environment variable it reads, reach the workers of the check, the search's trials and
the training job through `runtime_env`; without it the search fails at once, saying what
is missing. Each test starts its own local Ray (a job's runtime environment is set when it
connects), so this module takes no shared session."""

import importlib
import sys
import textwrap
import time

import pytest
import ray
import torch
from ray import cloudpickle  # Ray serialises functions with its own copy
from torch.utils.data import TensorDataset

import tula_ray
from tula_ray.cluster import ray_session
from tula_ray.failures import UserCodeError
from tula_ray.workloads import Workload

pytestmark = pytest.mark.ray

# This test module's own functions (the data) travel by value, as a driver script's do;
# the model's module travels by reference: its workers need it shipped.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MODULE = "tula_test_driver_only_models"
SEARCH = dict(cluster_sizes=(1,), min_batch=32, max_batch=64, warmup_steps=1, measure_steps=2,
              measure_seconds=0.2, training_strategy=None, objective="time")


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
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(MODULE), package
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(MODULE, None)


def images() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn((256, 3, 8, 8), generator=generator),
                         torch.randint(0, 4, (256,), generator=generator))


def test_without_runtime_env_the_search_says_the_workers_lack_the_module(driver_only_module,
                                                                         tmp_path):
    """The negative control: the same search, no runtime_env, fails at the check (before
    any trial) and names the remedy."""
    module, _ = driver_only_module
    assert not ray.is_initialized()
    started = time.monotonic()
    with pytest.raises(UserCodeError, match="cannot be rebuilt in a Ray worker.*py_modules") as info:
        tula_ray.search(Workload("driver-only", module.Net, images), storage_path=str(tmp_path),
                        **SEARCH)
    assert f"No module named '{MODULE}'" in info.value.traceback_text
    assert time.monotonic() - started < 60
    assert not list(tmp_path.iterdir()) and not ray.is_initialized()


def test_runtime_env_ships_the_module_and_the_variable_to_search_and_train(driver_only_module,
                                                                           tmp_path):
    module, package = driver_only_module
    runtime_env = {"py_modules": [str(package)], "env_vars": {"TULA_TEST_HIDDEN": "16"}}
    workload = Workload("driver-only", module.Net, images, images)
    with ray_session(runtime_env=runtime_env):  # one Ray, with the job's runtime_env
        plan = tula_ray.search(workload, storage_path=str(tmp_path / "search"),
                               runtime_env=runtime_env, **SEARCH)
        assert (plan.table["status"] == "ok").all() and len(plan.table) == 2
        result = tula_ray.train(plan, "lbt", workload=workload, epochs=1,
                                storage_path=str(tmp_path / "train"), runtime_env=runtime_env)
        assert list(result.metrics["epoch"]) == [0]
        with pytest.raises(ValueError, match="Ray is already initialised in this process with"):
            tula_ray.search(workload, runtime_env={"env_vars": {"TULA_TEST_HIDDEN": "8"}},
                            storage_path=str(tmp_path / "other"), **SEARCH)
    assert not (tmp_path / "other").exists()
