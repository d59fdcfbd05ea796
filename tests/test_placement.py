"""Topology, the Ray-facing half (issue 26 item 1), without a Ray session: G, the most
workers one node holds, read from given nodes and node types; N <= G placed on ONE node
(STRICT_PACK) and a larger N packed, by every run alike (the profiling trial, `train`,
`tune_training`'s trials); provisioning that asks the autoscaler for the same placement
and fails clearly when it can never be met or is not met in time. The nodes, the
autoscaler's node types and its request are stand-ins here (monkeypatched)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from tula_ray.cluster import (GPU_WORKER, Workers, can_place, groups_that_fit,
                              provision_workers, scaling_config, workers, workers_per_node)
from tula_ray.cluster.placement import bundles_fit, holds_placed
from tula_ray.models.topology import (PACK, STRICT_PACK, node_bundles, nodes_for,
                                      placement_strategy, worker_bundles)
from tula_ray.space import ProfileGrid
from tula_ray.training.profile_settings import ProfileSettings
from tula_ray.verbosity import VERBOSE_DEFAULT

HEAD = {"CPU": 0.0, "train_driver": 4.0}  # cluster.yaml's head: no worker fits on it
ONE_GPU = {"CPU": 8.0, "GPU": 1.0}  # cluster.yaml's gpu_worker
FOUR_GPU = {"CPU": 48.0, "GPU": 4.0}  # cluster.yaml's gpu_worker_4x
CLUSTER_YAML_TYPES = [(ONE_GPU, 16), (FOUR_GPU, 4)]


def _workers_in(bundle: dict[str, float], worker: dict[str, float]) -> float:
    ratios = {bundle[name] / amount for name, amount in worker.items()}
    assert len(ratios) == 1, (bundle, worker)  # a bundle is a whole number of workers
    return ratios.pop()


# ---------------------------------------------------------------- topology (no Ray)

@given(st.integers(1, 256), st.integers(1, 16))
def test_packed_n_spans_the_fewest_nodes_that_hold_it(num_workers, per_node):
    nodes = nodes_for(num_workers, per_node)
    assert nodes * per_node >= num_workers > (nodes - 1) * per_node
    assert nodes == 1 if num_workers <= per_node else nodes >= 2
    assert placement_strategy(num_workers, per_node) == (
        STRICT_PACK if num_workers <= per_node else PACK)


@given(st.integers(1, 64), st.one_of(st.none(), st.integers(1, 16)),
       st.sampled_from([{"CPU": 1.0}, GPU_WORKER, {"CPU": 2.0, "accel": 0.5}]))
def test_bundles_hold_n_workers_placed_as_the_trial_places_them(num_workers, per_node,
                                                                 worker):
    for bundles in (worker_bundles(worker, num_workers, per_node),
                    node_bundles(worker, num_workers, per_node)):
        sizes = [_workers_in(bundle, worker) for bundle in bundles]
        assert sum(sizes) == num_workers
    sizes = [_workers_in(b, worker) for b in node_bundles(worker, num_workers, per_node)]
    if per_node is None:  # nothing known to pack onto: one worker a bundle
        assert sizes == [1] * num_workers
    else:  # whole nodes of G, the rest on one more: nodes_for(N, G) of them
        assert len(sizes) == nodes_for(num_workers, per_node)
        assert max(sizes) <= per_node and sizes.count(per_node) == num_workers // per_node
    if placement_strategy(num_workers, per_node) == STRICT_PACK:  # one node, one bundle
        assert node_bundles(worker, num_workers, per_node) == worker_bundles(
            worker, num_workers, per_node) == [
            {name: amount * num_workers for name, amount in worker.items()}]


def test_unknown_workers_per_node_is_one_level():
    assert nodes_for(16, None) == 1 and placement_strategy(4, None) == PACK
    assert placement_strategy(0, 4) == PACK  # no workers: nothing to place strictly


# ---------------------------------------------------------------- G and placement counts

def test_workers_per_node_is_the_most_one_node_holds_running_or_addable():
    assert workers_per_node(GPU_WORKER, [HEAD, ONE_GPU], []) == 1
    assert workers_per_node(GPU_WORKER, [HEAD], CLUSTER_YAML_TYPES) == 4  # none up yet
    assert workers_per_node(GPU_WORKER, [HEAD], [(ONE_GPU, 16), (FOUR_GPU, 0)]) == 1
    assert workers_per_node({"CPU": 1.0}, [HEAD, ONE_GPU], CLUSTER_YAML_TYPES) == 48
    assert workers_per_node({"CPU": 16.0}, [ONE_GPU], []) is None  # no node holds one
    assert workers_per_node(GPU_WORKER, [HEAD], []) is None


def test_workers_per_node_looks_the_nodes_and_types_up_by_default(monkeypatch):
    monkeypatch.setattr(workers, "alive_node_resources", lambda: [HEAD, ONE_GPU])
    monkeypatch.setattr(workers, "joined_node_types", lambda: CLUSTER_YAML_TYPES)
    assert workers_per_node(GPU_WORKER) == 4
    monkeypatch.setattr(workers, "joined_node_types", lambda: None)  # no autoscaler
    assert workers_per_node(GPU_WORKER) == 1


def test_n_up_to_g_needs_one_node_that_holds_it_a_larger_n_any_nodes():
    four_ones = [ONE_GPU] * 4
    assert not can_place(GPU_WORKER, 4, 4, four_ones)  # 4 GPUs, but not on one node
    assert can_place(GPU_WORKER, 4, None, four_ones)  # G unknown: Ray's PACK, anywhere
    assert can_place(GPU_WORKER, 4, 4, [HEAD, FOUR_GPU])
    assert can_place(GPU_WORKER, 5, 4, [FOUR_GPU, ONE_GPU])
    assert not can_place(GPU_WORKER, 6, 4, [FOUR_GPU, ONE_GPU])
    # A run of N > G also needs a node of G: the N <= G of the same search go on one node.
    assert not holds_placed(GPU_WORKER, 8, 4, [ONE_GPU] * 8)
    assert holds_placed(GPU_WORKER, 8, 4, [FOUR_GPU] + [ONE_GPU] * 4)
    assert holds_placed(GPU_WORKER, 8, None, [ONE_GPU] * 8)


def test_groups_at_once_count_each_n_up_to_g_on_its_own_node():
    nodes = [FOUR_GPU, FOUR_GPU, ONE_GPU]
    assert groups_that_fit(GPU_WORKER, 3, 4, nodes) == 2  # not 9 // 3: one per 4-GPU node
    assert groups_that_fit(GPU_WORKER, 2, 4, nodes) == 4
    assert groups_that_fit(GPU_WORKER, 8, 4, nodes) == 1  # packed over any nodes
    assert groups_that_fit(GPU_WORKER, 3, None, nodes) == 3


def test_bundles_fit_only_where_a_node_has_room_for_each():
    four = {"CPU": 4.0, "GPU": 4.0}
    assert bundles_fit([four, four], [FOUR_GPU, FOUR_GPU, ONE_GPU])
    assert not bundles_fit([four, four], [FOUR_GPU] + [ONE_GPU] * 16)
    assert bundles_fit([four, {"CPU": 1.0, "GPU": 1.0}], [ONE_GPU, FOUR_GPU])  # largest first
    assert not bundles_fit([{"CPU": 2.0, "GPU": 2.0}], [ONE_GPU, ONE_GPU])


def test_a_runs_scaling_config_places_n_up_to_g_on_one_node():
    config = scaling_config(4, {"CPU": 1.0, "GPU": 1.0}, 4)
    assert (config.num_workers, config.use_gpu, config.placement_strategy) == (
        4, True, STRICT_PACK)
    assert config.resources_per_worker == {"CPU": 1.0, "GPU": 1.0}
    assert scaling_config(8, {"CPU": 1.0}, 4).placement_strategy == PACK
    assert not scaling_config(8, {"CPU": 1.0}, 4).use_gpu
    assert scaling_config(2, {"CPU": 1.0}, None).placement_strategy == PACK


# ---------------------------------------------------------------- provisioning

class _Cluster:
    """Stand-ins for the running nodes, the autoscaler's node types and its request: the
    nodes become `delivered` once the request is made."""

    def __init__(self, monkeypatch, nodes, node_types, delivered=None):
        self.nodes, self.delivered, self.requests = list(nodes), delivered, []
        monkeypatch.setattr(workers, "alive_node_resources", lambda: list(self.nodes))
        monkeypatch.setattr(workers, "joined_node_types", lambda: node_types)
        monkeypatch.setattr(workers, "request_workers", self.request)
        monkeypatch.setattr(workers.ray, "cluster_resources", lambda: {"CPU": 1.0})
        monkeypatch.setattr(workers.ray, "is_initialized", lambda: False)
        monkeypatch.setattr(workers, "PROVISION_POLL_S", 0.01)

    def request(self, bundles):
        self.requests.append(bundles)
        if bundles and self.delivered is not None:
            self.nodes = list(self.delivered)


def test_a_static_cluster_is_used_as_it_is(monkeypatch):
    cluster = _Cluster(monkeypatch, [{"CPU": 4.0}, {"CPU": 4.0}], None)
    settled = provision_workers(4, {"CPU": 1.0})
    assert settled == Workers({"CPU": 1.0}, False, requested=False, workers_per_node=4)
    assert provision_workers(8, {"CPU": 1.0}).workers_per_node == 4  # packed on both
    with pytest.raises(ValueError, match="cluster size 9 is larger than the cluster's 8 CPUs"):
        provision_workers(9, {"CPU": 1.0})
    assert cluster.requests == []


def test_n_up_to_g_is_asked_of_the_autoscaler_as_one_node(monkeypatch):
    cluster = _Cluster(monkeypatch, [HEAD], CLUSTER_YAML_TYPES, delivered=[HEAD, FOUR_GPU])
    settled = provision_workers(4, GPU_WORKER, timeout_s=5)
    assert cluster.requests == [[{"CPU": 4.0, "GPU": 4.0}]]  # one bundle: STRICT_PACK's
    assert (settled.requested, settled.workers_per_node) == (True, 4)


@pytest.mark.parametrize("num_workers, bundles", [
    (16, [{"CPU": 4.0, "GPU": 4.0}] * 4),
    (6, [{"CPU": 4.0, "GPU": 4.0}, {"CPU": 2.0, "GPU": 2.0}])])
def test_a_larger_n_is_asked_for_as_whole_nodes_of_g(monkeypatch, num_workers, bundles):
    cluster = _Cluster(monkeypatch, [HEAD], CLUSTER_YAML_TYPES,
                       delivered=[HEAD] + [FOUR_GPU] * len(bundles))
    assert provision_workers(num_workers, GPU_WORKER, timeout_s=5).workers_per_node == 4
    assert cluster.requests == [bundles]


def test_enough_gpus_on_the_wrong_nodes_are_not_enough(monkeypatch):
    # Four one-GPU nodes are up; a four-GPU type exists, so N = 4 runs on one node of it.
    cluster = _Cluster(monkeypatch, [HEAD] + [ONE_GPU] * 4, CLUSTER_YAML_TYPES,
                       delivered=[HEAD] + [ONE_GPU] * 4 + [FOUR_GPU])
    assert provision_workers(4, GPU_WORKER, timeout_s=5).requested
    assert cluster.requests == [[{"CPU": 4.0, "GPU": 4.0}]]


def test_a_placement_not_met_in_time_is_a_timeout(monkeypatch):
    # The autoscaler adds four one-GPU nodes: four GPUs, none of them together.
    _Cluster(monkeypatch, [HEAD], CLUSTER_YAML_TYPES, delivered=[HEAD] + [ONE_GPU] * 4)
    with pytest.raises(TimeoutError, match=r"4 workers of .* on one node .* holds 4, at most "
                                           r"1 on one node.*ray status"):
        provision_workers(4, GPU_WORKER, timeout_s=0.05)


def test_a_placement_that_can_never_be_met_is_refused_at_once(monkeypatch):
    cluster = _Cluster(monkeypatch, [HEAD], [(ONE_GPU, 16), (FOUR_GPU, 1)])
    with pytest.raises(ValueError, match="takes 2 nodes that each hold 4 .* give 1 nodes of "
                                         "4: raise max_workers .* cluster sizes <= 4"):
        provision_workers(8, GPU_WORKER, timeout_s=5)
    with pytest.raises(ValueError, match="at most 20 workers .* fewer than 21"):
        provision_workers(21, GPU_WORKER, timeout_s=5)
    assert cluster.requests == []  # refused before asking


# ---------------------------------------------------------------- the runs' trainers

class _Trainer:
    """A TorchTrainer that keeps what it was built with and fits nothing."""

    def __init__(self, built: dict, loop, **kwargs) -> None:
        built.update(kwargs)

    def fit(self) -> None:
        return None


def _captured_trainer(monkeypatch, module) -> dict:
    built: dict = {}
    monkeypatch.setattr(module, "TorchTrainer", lambda loop, **kwargs: _Trainer(
        built, loop, **kwargs))
    return built


@pytest.mark.parametrize("num_workers, per_node, strategy", [
    (2, 4, STRICT_PACK), (4, 4, STRICT_PACK), (8, 4, PACK), (2, None, PACK)])
def test_a_profiling_trial_places_n_as_training_will(monkeypatch, num_workers, per_node,
                                                      strategy):
    import trainables.profiling_trial as trial

    built = _captured_trainer(monkeypatch, trial)
    trial.build_trainer({"num_workers": num_workers, "global_batches": [32], "use_gpu": False,
                         "resources_per_worker": {"CPU": 1}, "workload": "fashion-mnist-cnn",
                         "workers_per_node": per_node})
    scaling = built["scaling_config"]
    assert (scaling.num_workers, scaling.placement_strategy) == (num_workers, strategy)
    assert "workers_per_node" not in built["train_loop_config"]  # the trial's, not the loop's
    # the batches go to the loop typed, read from the trial config once
    assert built["train_loop_config"]["profile_grid"] == ProfileGrid(num_workers, (32,))
    assert "global_batches" not in built["train_loop_config"]


def test_a_trial_that_cannot_place_n_on_one_node_says_so(monkeypatch):
    import trainables.profiling_trial as trial

    monkeypatch.setattr(trial, "alive_node_resources", lambda: [{"CPU": 2.0}, {"CPU": 2.0}])
    def settings(per_node: int) -> ProfileSettings:
        return ProfileSettings(resources_per_worker={"CPU": 1}, use_gpu=False,
                               provision_timeout_s=0, workers_per_node=per_node)

    assert trial._cannot_place(4, settings(2)) == ""  # packed: fits
    missing = trial._cannot_place(4, settings(4))  # its node was lost
    assert "no node holds the N=4 workers" in missing and "the largest holds 2" in missing
    assert "holds 4 workers of {'CPU': 1} now, fewer than N=5" in trial._cannot_place(
        5, settings(2))
    # A failed group's rows say where it ran when its placement fixes it.
    assert trial._placed_nodes(4, settings(4)) == 1.0
    assert math.isnan(trial._placed_nodes(8, settings(4)))


def test_each_round_asks_the_autoscaler_for_its_own_n(monkeypatch):
    """On an autoscaling cluster (the driver holds a keeper) a trial makes its N the
    request, so a smaller N after a larger lets the larger's nodes go idle, and waits for
    its nodes as long as provision_timeout_s."""
    import trainables.profiling_trial as trial

    nodes, held = [HEAD], []

    def hold(keeper, bundles):
        held.append(bundles)
        nodes[:] = [HEAD] + [FOUR_GPU] * len(bundles)  # the autoscaler delivers

    monkeypatch.setattr(trial, "job_keeper", lambda: "the driver's keeper")
    monkeypatch.setattr(trial, "hold_request", hold)
    monkeypatch.setattr(trial, "alive_node_resources", lambda: list(nodes))
    settings = ProfileSettings(resources_per_worker=GPU_WORKER, use_gpu=True,
                               provision_timeout_s=5, workers_per_node=4)
    assert trial._cannot_place(8, settings) == "" and trial._cannot_place(2, settings) == ""
    assert held == [[{"CPU": 4.0, "GPU": 4.0}] * 2, [{"CPU": 2.0, "GPU": 2.0}]]
    # Without a keeper (no autoscaler) nothing is asked, and a lost node is waited for.
    monkeypatch.setattr(trial, "job_keeper", lambda: None)
    assert trial._cannot_place(2, settings) == "" and len(held) == 2


def test_the_search_provisions_one_worker_first_and_checks_its_largest_n(monkeypatch):
    cluster = _Cluster(monkeypatch, [HEAD], CLUSTER_YAML_TYPES, delivered=[HEAD, FOUR_GPU])
    settled = provision_workers(1, GPU_WORKER, timeout_s=5, most_workers=16)
    assert cluster.requests == [[{"CPU": 1.0, "GPU": 1.0}]]  # the probe's, not N = 16's
    assert (settled.requested, settled.workers_per_node) == (True, 4)
    cluster = _Cluster(monkeypatch, [HEAD], CLUSTER_YAML_TYPES)
    with pytest.raises(ValueError, match="cannot place 21 workers .* cluster sizes <= 16"):
        provision_workers(1, GPU_WORKER, timeout_s=5, most_workers=21)
    assert cluster.requests == []  # refused before asking
    _Cluster(monkeypatch, [{"CPU": 2.0}], None)
    with pytest.raises(ValueError, match="cluster size 3 is larger than the cluster's 2 CPUs"):
        provision_workers(1, {"CPU": 1.0}, most_workers=3)


def test_train_and_tuning_trials_place_n_as_it_was_profiled(monkeypatch):
    from trainables import tuning_trial
    from tula_ray.runs import train
    from tula_ray.runs.training_job import Job
    from tula_ray.workloads import resolve_workload

    built = _captured_trainer(monkeypatch, train)
    job = Job("fashion-mnist-cnn", {}, resolve_workload("fashion-mnist-cnn"), 4, 128, 1,
              "lbt", {}, ())
    config = train._loop_config(job, seed=0, lr=None, budget="epochs",
                                verbose=VERBOSE_DEFAULT, fail_at_epoch=None, marker_dir=None)
    run_config = train._run_config(job, storage_path=None, name="run", max_failures=0)
    train._trainer(job, config, Workers({"CPU": 1.0}, False, False, 4), run_config)
    assert built["scaling_config"].placement_strategy == STRICT_PACK
    train._trainer(job, config, Workers({"CPU": 1.0}, False, False, 2), run_config)
    assert built["scaling_config"].placement_strategy == PACK

    built = _captured_trainer(monkeypatch, tuning_trial)
    monkeypatch.setattr(tuning_trial.tune, "get_context",
                        lambda: type("Context", (), {"get_trial_dir": lambda self: "/tmp"})())
    # No Tune session here: the reporting fit (no callback) and Train's run config are
    # stand-ins.
    monkeypatch.setattr(tuning_trial, "TuneReports", lambda: SimpleNamespace(
        callbacks=[], fit=lambda trainer: trainer.fit()))
    monkeypatch.setattr(tuning_trial, "RunConfig", SimpleNamespace)
    fixed = {"workload": "fashion-mnist-cnn", "workload_options": {}, "global_batch": 64,
             "epochs": 1, "strategy": "lrs", "strategy_options": {}, "seed": 0,
             "validation_fraction": 0.2, "num_workers": 2, "use_gpu": False,
             "resources": {"CPU": 1}, "workers_per_node": 2}
    tuning_trial.tune_trial({"lr": 0.1}, fixed)
    assert built["scaling_config"].placement_strategy == STRICT_PACK


# ---------------------------------------------------------------- the rows' num_nodes

def test_a_group_spans_its_workers_distinct_nodes(monkeypatch):
    from trainables import profiling_loop
    from tula_ray.training import profile_sweep

    gathered = []
    monkeypatch.setattr(profile_sweep, "gathered_objects",
                        lambda node, group: gathered.append(node) or ["n1", "n2", "n1", node])
    assert profile_sweep.nodes_spanned("n3") == 3 and gathered == ["n3"]
    assert profile_sweep.nodes_spanned("n2") == 2 and gathered[-1] == "n2"
    monkeypatch.setattr(profile_sweep.socket, "gethostname", lambda: "host")
    assert profile_sweep.SweepWorker.of_process_group().node == "host"  # outside Ray: hosts
    # In a Ray Train worker: Ray's node ID
    monkeypatch.setattr(profiling_loop.ray, "get_runtime_context",
                        lambda: SimpleNamespace(get_node_id=lambda: "n2"))
    monkeypatch.setattr(profiling_loop.ray.train, "get_context", lambda: SimpleNamespace(
        get_world_size=lambda: 4, get_world_rank=lambda: 1))
    monkeypatch.setattr(profiling_loop.ray.train.torch, "get_device", lambda: "cpu")
    assert profiling_loop.this_worker().node == "n2"


@pytest.mark.parametrize("outcome", ["ok", "oom"])
def test_every_row_of_a_group_records_its_nodes(outcome):
    import torch

    from tula_ray.training.profile_sweep import profile_batch

    def profile(global_batch):
        if outcome == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"step_time_s": 0.1, "compute_time_s": 0.08}

    sweep = SimpleNamespace(world_size=4, num_nodes=2, profile=profile,
                            workload=SimpleNamespace(name="stand-in"))
    row = profile_batch(sweep, 64)
    assert (row["status"], row["num_nodes"]) == (outcome, 2)
