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
