"""Cluster concerns, in one place (Ray-facing): the entry points and the trainables take
these from here, never from each other.

  session  starting or joining Ray for an entry point's run (loopback-only by default);
  workers  what one worker holds, provisioning N of them, a trial driver's resources;
  placement where a group of N workers goes on given nodes, and the ScalingConfig that
           places it so (N <= G workers per node on one node; issue 26);
  requests the autoscaler request, held by a keeper that withdraws it once its driver
           is gone (SIGKILL, an ssh drop);
  storage  a storage path every node of a multi-node cluster reaches;
  lifetime `cluster_for_run`: the three above for the length of one entry point's run.
"""

from tula_ray.cluster.lifetime import cluster_for_run
from tula_ray.cluster.placement import (can_place, groups_that_fit, scaling_config,
                                        workers_that_fit)
from tula_ray.cluster.requests import (KEEPER_NAMESPACE, STALE_S, RequestKeeper, driver_keeper,
                                       hold_request, job_keeper, keeper_name,
                                       withdraw_request)
from tula_ray.cluster.session import (ADDRESS_ENV, DRIVER_RESOURCE, DRIVER_SLOTS_DEFAULT,
                                      LOCAL_ADDRESS, LOCAL_NODE_IP, LOCAL_ONLY_ENV,
                                      check_address, check_runtime_env, ensure_ray,
                                      ray_session, refuse_a_second_ray, running_ray_address,
                                      start_local_ray, started_ray_here)
from tula_ray.cluster.storage import check_storage_path, nodes_not_seeing
from tula_ray.cluster.workers import (AUTOSCALING_CONFIG_ENV, AUTOSCALING_CONFIG_PATH,
                                      CPU_MEMORY_SHARE_DEFAULT, CPU_WORKER, GPU_WORKER,
                                      PROVISION_POLL_S, PROVISION_TIMEOUT_S_DEFAULT,
                                      PREEMPTION_WATCHER_ENV, TRAIN_POLL_ENV, TRAIN_POLL_S,
                                      prompt_train_polls, without_preemption_watcher,
                                      RESOURCE_PRECISION, WORKER_GROUP_START_RETRIES, Workers,
                                      alive_node_resources, autoscaler_node_types,
                                      check_resources_per_worker, check_worker_request,
                                      gpu_worker, joined_node_types, provision_workers,
                                      release_workers, request_workers, task_options, trial_resources,
                                      use_gpu_default, worker_shape, workers_per_node)
from tula_ray.training.host_allocator import node_memory_bytes  # the CPU worker's memory

__all__ = ['ADDRESS_ENV', 'KEEPER_NAMESPACE', 'RequestKeeper', 'driver_keeper', 'hold_request',
           'job_keeper', 'keeper_name', 'STALE_S', 'withdraw_request', 'request_workers', 'cluster_for_run', 'AUTOSCALING_CONFIG_ENV', 'AUTOSCALING_CONFIG_PATH',
           'CPU_MEMORY_SHARE_DEFAULT', 'CPU_WORKER', 'DRIVER_RESOURCE',
           'DRIVER_SLOTS_DEFAULT', 'GPU_WORKER', 'LOCAL_ADDRESS', 'LOCAL_NODE_IP',
           'LOCAL_ONLY_ENV', 'PROVISION_POLL_S', 'TRAIN_POLL_ENV', 'TRAIN_POLL_S',
           'prompt_train_polls', 'PREEMPTION_WATCHER_ENV', 'without_preemption_watcher',
           'PROVISION_TIMEOUT_S_DEFAULT',
           'RESOURCE_PRECISION', 'WORKER_GROUP_START_RETRIES', 'Workers',
           'alive_node_resources', 'autoscaler_node_types', 'check_address',
           'check_resources_per_worker', 'check_runtime_env', 'check_storage_path',
           'check_worker_request', 'ensure_ray', 'gpu_worker', 'joined_node_types', 'node_memory_bytes',
           'nodes_not_seeing', 'provision_workers', 'ray_session', 'refuse_a_second_ray',
           'release_workers', 'running_ray_address', 'start_local_ray', 'started_ray_here', 'task_options', 'trial_resources', 'use_gpu_default',
           'worker_shape', 'workers_per_node', 'workers_that_fit', 'can_place',
           'groups_that_fit', 'scaling_config']
