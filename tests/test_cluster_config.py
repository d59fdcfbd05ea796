"""cluster.yaml is a valid Ray autoscaler config for one-GPU and four-GPU workers (no Ray
session needed), and its nodes are set up as issue 26 item 4 asks: workers reach the
storage bucket, `ray up` ships no local venv, every package is pinned (constraints.txt), no
setup pipe hides a failure, and a GPU worker has a CUDA torch that sees its GPU. Its
multi-GPU type makes topology (issue 26 item 1) part of the shipped config. Its IAM roles
(deploy/aws/, issue 45 item 1) and the guide's commands agree with it, and `ray down`
leaves no stopped node billing (item 3)."""

import copy
import json
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from jsonschema import ValidationError
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).parents[1]
CONFIG = yaml.safe_load((ROOT / "cluster.yaml").read_text())
CONSTRAINTS = ROOT / "constraints.txt"
GUIDE = ROOT / "docs" / "guide" / "cluster.md"
IAM = ROOT / "deploy" / "aws"  # the policy documents of cluster.yaml's roles
GPU_TYPES = ("gpu_worker", "gpu_worker_4x")  # one GPU per node, four per node


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
    assert set(types) == {CONFIG["head_node_type"], *GPU_TYPES}
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
    for node_type in GPU_TYPES:
        family = CONFIG["available_node_types"][node_type]["node_config"]["InstanceType"]
        family = family.split(".")[0]
        # A cubin runs on GPUs of its major version with an equal or higher minor version.
        assert any(c // 10 == AWS_GPU_CAPABILITY[family] // 10
                   and c <= AWS_GPU_CAPABILITY[family] for c in capabilities), (family,
                                                                               capabilities)
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


# ------------------------------------------------- node setup (issue 26 item 4)

def _all_commands() -> list[str]:
    return [command for key in ("initialization_commands", "setup_commands",
                                "head_setup_commands", "worker_setup_commands")
            for command in CONFIG.get(key) or []]


@pytest.mark.parametrize("node_type", GPU_TYPES)
def test_gpu_workers_get_an_instance_profile_that_reaches_storage(node_type):
    # Ray's AWS provider gives a profile (its own ray-autoscaler-v1) to the head only.
    profile = CONFIG["available_node_types"][node_type]["node_config"]["IamInstanceProfile"]
    assert set(profile) in ({"Name"}, {"Arn"}) and all(profile.values()), profile


# Per AWS's instance tables: GPUs and vCPUs of each worker instance type the config uses.
AWS_INSTANCE = {"g5.2xlarge": (1, 8), "g5.12xlarge": (4, 48)}


def test_a_multi_gpu_worker_type_exercises_topology_with_the_one_gpu_types_setup():
    from tula_ray.cluster import GPU_WORKER, autoscaler_node_types, workers_per_node

    types = CONFIG["available_node_types"]
    one, multi = types["gpu_worker"], types["gpu_worker_4x"]
    # Its declared resources are its instance's, with more than one GPU (Ray detects a
    # launched node's own, but the autoscaler plans with these).
    gpus, cpus = AWS_INSTANCE[multi["node_config"]["InstanceType"]]
    assert multi["resources"] == {"CPU": cpus, "GPU": gpus} and gpus > 1
    assert one["resources"] == dict(zip(("GPU", "CPU"), AWS_INSTANCE[
        one["node_config"]["InstanceType"]]))
    # The same image and storage profile; setup is every worker's (no per-type override).
    for key in ("ImageId", "IamInstanceProfile"):
        assert multi["node_config"][key] == one["node_config"][key], key
    for node_type in (one, multi):
        assert not {"worker_setup_commands", "setup_commands"} & set(node_type), node_type
    # Coherent counts: start at zero, the paper's 16 GPUs on either type, within the total.
    assert multi["min_workers"] == 0
    assert multi["max_workers"] * gpus == one["max_workers"] == 16
    assert multi["max_workers"] <= CONFIG["max_workers"]
    # What a search reads from it: four one-GPU workers to a node (G = 4).
    node_types = autoscaler_node_types(str(ROOT / "cluster.yaml"))
    assert workers_per_node(GPU_WORKER, [{"CPU": 0.0}], node_types) == gpus


def test_ray_up_ships_no_local_venv_git_history_or_build_output():
    excluded = CONFIG["rsync_exclude"]
    for name in (".venv", ".git", "/build", "__pycache__"):
        assert name in excluded, (name, excluded)
    assert CONFIG["rsync_filter"] == [".gitignore"]  # and what git ignores
    assert CONFIG["file_mounts"] == {"~/tula-ray": "."}


def test_every_piped_setup_command_runs_under_pipefail():
    piped = [c for c in _all_commands() if re.search(r"(?<!\|)\|(?!\|)", c)]
    assert piped  # the driver check pipes nvidia-smi into awk
    for command in piped:
        assert command.startswith("set -o pipefail;"), command


@pytest.mark.parametrize("nvidia_smi, accepted", [
    ("echo 580.65.06", True), ("echo 575.57.08", False),
    ("echo 'NVIDIA-SMI has failed: no driver' >&2; exit 9", False)])  # awk reads nothing
def test_a_failing_nvidia_smi_fails_the_driver_check(tmp_path, nvidia_smi, accepted):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/bash\n{nvidia_smi}\n")
    fake.chmod(0o755)
    check = next(c for c in CONFIG["worker_setup_commands"] if "nvidia-smi" in c)
    completed = subprocess.run(["bash", "-c", check], capture_output=True, text=True,
                               env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (completed.returncode == 0) == accepted, (completed.stdout, completed.stderr)


def test_gpu_workers_refuse_a_torch_that_is_no_cuda_build_or_sees_no_gpu():
    check = next(c for c in CONFIG["worker_setup_commands"] if "torch.version.cuda" in c)
    argv = shlex.split(check)
    assert argv[:2] == ["python3", "-c"] and "torch.cuda.is_available()" in argv[2]
    import torch

    # Here: the pinned CUDA build of torch, and no GPU: the check must say so.
    completed = subprocess.run([sys.executable, "-c", argv[2]], capture_output=True, text=True)
    if torch.cuda.is_available():
        assert completed.returncode == 0, completed.stderr
    else:
        assert torch.version.cuda is not None  # the pin is a CUDA build
        assert completed.returncode != 0 and "sees no GPU" in completed.stderr


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert name and version and " " not in line, f"not name==version: {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def _runtime_closure() -> set[str]:
    """Names of every installed package tula-ray's runtime dependencies pull in (extras
    followed, e.g. ray[tune,train,default]; not tula-ray's own test or bench extras)."""
    todo = [Requirement(r) for r in metadata.requires("tula-ray")
            if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": ""})]
    seen: dict[str, set[str]] = {}
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen and set(requirement.extras) <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | set(requirement.extras)
        for line in metadata.requires(name) or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra})
                                            for extra in ["", *seen[name]]):
                todo.append(needed)
    return set(seen)


def test_the_nodes_install_under_a_constraints_file_that_pins_every_package():
    install = next(c for c in CONFIG["setup_commands"] if "pip install" in c and "tula-ray" in c)
    assert "-c ~/tula-ray/constraints.txt" in install
    pins = _pins()
    assert pins["torch"] == "2.14.1"
    # Every dependency of pyproject is pinned, to a version it allows.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None and requirement.specifier.contains(pinned), (line, pinned)
    # ... and so is every package they pull into this venv (else regenerate constraints.txt,
    # as its header says).
    missing = sorted(_runtime_closure() - set(pins))
    assert not missing, f"constraints.txt does not pin {missing}"


def test_worker_nodes_stage_the_built_in_data_once():
    from tula_ray.workloads import stage

    assert callable(stage.main)
    assert any(c.startswith("python3 -m tula_ray.workloads.stage")
               for c in CONFIG["worker_setup_commands"])


# ------------------------------------------------- IAM and stopped nodes (issue 45)

BUCKET_PLACEHOLDER = "YOUR-BUCKET"


def _guide_iam_commands() -> list[list[str]]:
    """The guide's `aws iam` commands, each as its argv."""
    return [shlex.split(line) for line in GUIDE.read_text().splitlines()
            if line.startswith("aws iam ")]


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _policy(argv: list[str]) -> dict:
    """The policy document a command names: a file of deploy/aws, or the guide's copy of
    the bucket policy with the placeholder filled in (read from deploy/aws)."""
    option = "--assume-role-policy-document" if "create-role" in argv else "--policy-document"
    path = _option(argv, option).removeprefix("file://")
    if path.startswith("/tmp/"):
        assert path.endswith("bucket-policy.json"), path
        path = "deploy/aws/bucket-policy.json"
    return json.loads((ROOT / path).read_text())


def _profile(node_type: str) -> str:
    return CONFIG["available_node_types"][node_type]["node_config"]["IamInstanceProfile"]["Name"]


def test_cluster_yaml_the_iam_policies_and_the_guide_name_the_same_roles():
    head, workers = _profile(CONFIG["head_node_type"]), {_profile(t) for t in GPU_TYPES}
    assert len(workers) == 1 and head not in workers, (head, workers)
    worker = workers.pop()
    commands = _guide_iam_commands()
    by_verb: dict[str, list[list[str]]] = {}
    for argv in commands:
        by_verb.setdefault(argv[2], []).append(argv)
    # Each profile cluster.yaml names is created, holding the role of its own name.
    assert {_option(a, "--instance-profile-name") for a in by_verb["create-instance-profile"]} \
        == {head, worker}
    assert {(_option(a, "--instance-profile-name"), _option(a, "--role-name"))
            for a in by_verb["add-role-to-instance-profile"]} == {(head, head), (worker, worker)}
    for argv in by_verb["create-role"]:  # both roles trust EC2
        statement, = _policy(argv)["Statement"]
        assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    policies: dict[str, list[dict]] = {}
    for argv in by_verb["put-role-policy"]:
        policies.setdefault(_option(argv, "--role-name"), []).append(_policy(argv))
    statements = {role: [s for p in documents for s in p["Statement"]]
                  for role, documents in policies.items()}
    # The head may pass the worker role (and only it) to EC2; the worker passes none.
    passes = [s for s in statements[head] if s["Action"] == "iam:PassRole"]
    assert [s["Resource"] for s in passes] == [f"arn:aws:iam::*:role/{worker}"]
    assert passes[0]["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
    assert not any("iam:" in str(s["Action"]) for s in statements[worker])
    assert [_option(a, "--role-name") for a in by_verb["attach-role-policy"]] == [head]
    # Both reach the bucket, named by one placeholder that the guide fills in.
    for role in (head, worker):
        buckets = {s["Resource"] for s in statements[role] if "s3:" in str(s["Action"])}
        assert buckets == {f"arn:aws:s3:::{BUCKET_PLACEHOLDER}",
                           f"arn:aws:s3:::{BUCKET_PLACEHOLDER}/*"}, (role, buckets)
    assert f"sed 's/{BUCKET_PLACEHOLDER}/" in GUIDE.read_text()
    assert f"s3://{BUCKET_PLACEHOLDER}/" in (ROOT / "cluster.yaml").read_text()
    # Every policy document shipped is one the guide uses.
    used = {_option(a, o).removeprefix("file://") for a in commands
            for o in ("--assume-role-policy-document", "--policy-document") if o in a}
    shipped = {f"deploy/aws/{p.name}" for p in IAM.glob("*.json")}
    assert shipped - used == {"deploy/aws/bucket-policy.json"}  # used through sed's copy
    assert "Not verified on hardware" in GUIDE.read_text()


def test_ray_down_terminates_gpu_nodes_rather_than_stopping_them():
    # Ray's default (true) stops a node instead, and a stopped node's disk keeps billing.
    assert CONFIG["provider"]["cache_stopped_nodes"] is False
    text = (ROOT / "cluster.yaml").read_text()
    why = text[:text.index("cache_stopped_nodes:")].rsplit("region:", 1)[1]
    assert "billing" in why, why
    assert "`cache_stopped_nodes: false`" in GUIDE.read_text()


# Issue 45, item 5: the NCCL the training process loads, and the interface NCCL and gloo
# talk over (YAML and a check of its own: not verified on GPU hardware, the guide says so).
TORCH_NCCL = "/home/ubuntu/tula-venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
SYSTEM_NCCL = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"


def _maps(*paths: str) -> str:
    return "".join(f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 103:01 {i} {path}\n"
                   for i, path in enumerate(paths)) + "7ffd000-7ffe000 rw-p 0 00:00 0 [stack]\n"


def test_gpu_workers_check_that_they_load_torchs_own_nccl():
    from tula_ray.cluster.node_check import check_nccl, loaded_libraries

    assert "python3 -m tula_ray.cluster.node_check" in CONFIG["worker_setup_commands"]
    assert loaded_libraries(_maps("/lib/libc.so.6", TORCH_NCCL, TORCH_NCCL)) == [TORCH_NCCL]
    check_nccl([TORCH_NCCL])
    with pytest.raises(RuntimeError, match=f"loads NCCL from {SYSTEM_NCCL}.*LD_LIBRARY_PATH"):
        check_nccl(loaded_libraries(_maps(SYSTEM_NCCL, TORCH_NCCL)))
    with pytest.raises(RuntimeError, match="loaded no libnccl"):
        check_nccl(loaded_libraries(_maps("/lib/libc.so.6")))


def test_the_node_check_passes_on_a_machine_without_a_gpu():
    import torch

    done = subprocess.run([sys.executable, "-m", "tula_ray.cluster.node_check"],
                          capture_output=True, text=True)
    if not torch.cuda.is_available():
        assert done.returncode == 0 and "no GPU" in done.stderr


def test_nccl_and_gloo_talk_over_the_default_routes_interface():
    (start,) = [c for c in CONFIG["worker_start_ray_commands"] if "ray start" in c]
    assert start.startswith("set -o pipefail;")
    assert "IFACE=$(ip -o -4 route show to default" in start
    assert "NCCL_SOCKET_IFNAME=$IFACE GLOO_SOCKET_IFNAME=$IFACE" in start
    assert start.index("GLOO_SOCKET_IFNAME") < start.index("ray start")  # ray start inherits


def test_the_commented_8_gpu_efa_example_is_a_node_type_when_uncommented():
    lines = (ROOT / "cluster.yaml").read_text().splitlines()
    start = lines.index("  # gpu_worker_8x_efa:")
    block = []
    for line in lines[start:]:
        if not line.startswith("  # "):
            break
        block.append(line[4:])
    (name, spec), = yaml.safe_load("\n".join(block)).items()
    assert name == "gpu_worker_8x_efa" and spec["resources"] == {"CPU": 96, "GPU": 8}
    interfaces = spec["node_config"]["NetworkInterfaces"]
    assert [i["NetworkCardIndex"] for i in interfaces] == [0, 1, 2, 3]
    assert all(i["InterfaceType"] == "efa" for i in interfaces)
    assert len({(i["SubnetId"], tuple(i["Groups"])) for i in interfaces}) == 1  # one subnet
    assert spec["node_config"]["IamInstanceProfile"] == {"Name": "tula-ray-worker"}
    from tula_ray.cluster import gpu_worker

    assert gpu_worker([spec["resources"]]) == {"CPU": 12.0, "GPU": 1.0}
    config = copy.deepcopy(CONFIG)
    config["available_node_types"][name] = spec
    validate_config(prepare_config(config))  # Ray's schema takes it
