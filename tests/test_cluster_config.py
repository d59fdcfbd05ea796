"""cluster.yaml is a valid Ray autoscaler config for one-GPU workers (no Ray session needed)."""

import copy
from pathlib import Path

import pytest
import yaml
from jsonschema import ValidationError
from ray.autoscaler._private.util import prepare_config, validate_config

CONFIG = yaml.safe_load((Path(__file__).parents[1] / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_schema():
    validate_config(prepare_config(copy.deepcopy(CONFIG)))


def test_the_schema_check_rejects_a_broken_config():
    broken = copy.deepcopy(CONFIG)
    broken["available_node_types"]["gpu_worker"]["max_wokers"] = 16  # a typo
    with pytest.raises(ValidationError, match="max_wokers"):
        validate_config(prepare_config(broken))


def test_workers_have_one_gpu_and_the_head_offers_trial_drivers():
    types = CONFIG["available_node_types"]
    assert types["gpu_worker"]["resources"]["GPU"] == 1
    assert types["gpu_worker"]["max_workers"] == CONFIG["max_workers"] == 16
    assert types[CONFIG["head_node_type"]]["resources"]["train_driver"] >= 1
    assert any("pip install" in command and "tula-ray" in command
               for command in CONFIG["setup_commands"])


# Compute capability of the GPU in each AWS instance family (NVIDIA's tables): which
# families the installed torch can run on is decided against its own arch list below.
AWS_GPU_CAPABILITY = {"p3": 70, "g4dn": 75, "p4d": 80, "p4de": 80, "g5": 86, "g6": 89,
                      "g6e": 89, "p5": 90, "p5e": 90}


def test_gpu_workers_are_gpus_the_installed_torch_has_kernels_for():
    import torch

    capabilities = sorted(int(arch.removeprefix("sm_")) for arch in torch.cuda.get_arch_list())
    family = CONFIG["available_node_types"]["gpu_worker"]["node_config"]["InstanceType"]
    family = family.split(".")[0]
    # A cubin runs on GPUs of its major version with an equal or higher minor version.
    assert any(c // 10 == AWS_GPU_CAPABILITY[family] // 10 and c <= AWS_GPU_CAPABILITY[family]
               for c in capabilities), (family, capabilities)
    assert AWS_GPU_CAPABILITY["p3"] < capabilities[0]  # the old V100 config could not run


def test_gpu_image_is_current_and_its_driver_is_checked():
    for node_type in CONFIG["available_node_types"].values():
        assert node_type["node_config"]["ImageId"] != "latest_dlami"  # a 2023 Ubuntu 18.04 DLAMI
        assert node_type["node_config"]["ImageId"].startswith("resolve:ssm:/aws/service/")
    assert any("nvidia-smi" in command and "580" in command
               for command in CONFIG["worker_setup_commands"])


@pytest.mark.parametrize("driver, accepted", [("575.57.08", False), ("580.65.06", True),
                                              ("590.12", True), ("535.247.01", False)])
def test_the_driver_check_refuses_drivers_older_than_580(driver, accepted):
    import subprocess

    check = next(c for c in CONFIG["worker_setup_commands"] if "nvidia-smi" in c)
    awk = check.split("|", 1)[1]  # what reads nvidia-smi's output
    completed = subprocess.run(["bash", "-c", f"echo {driver} |{awk}"], capture_output=True,
                               text=True)
    assert (completed.returncode == 0) == accepted, completed.stdout


def test_the_local_cluster_config_passes_rays_schema_and_stays_on_loopback():
    import ipaddress

    local = yaml.safe_load((Path(__file__).parents[1] / "cluster-local.yaml").read_text())
    validate_config(prepare_config(copy.deepcopy(local)))
    provider = local["provider"]
    assert provider["type"] == "local"
    addresses = [provider["head_ip"], *provider["worker_ips"]]
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses)
    commands = " ".join(local["head_start_ray_commands"] + local["worker_start_ray_commands"])
    for address in addresses:  # every node binds its own loopback address, not the default
        assert f"--node-ip-address={address}" in commands
