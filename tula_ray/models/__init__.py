"""The paper's models of one configuration (N, B), pure functions fitted from profiles:

  perf           time per step = compute + sync (eq. 2) and training time (eq. 4a);
  compute_forms  the shapes the compute term may take (linear, as the paper, and beyond);
  memory         peak memory per local batch (eq. 3), the largest feasible local batch;
  pricing        what a configuration costs (eq. 4b, and memory-based pricing).

Core: no Ray; above the shared vocabulary (space, profile_table), below planning.
"""
