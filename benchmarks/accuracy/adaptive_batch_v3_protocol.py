"""The adaptive-batch benchmark's third protocol (issue 44, item 4), fixed here before its
first recorded run (tests/test_benchmark_protocols.py checks the order from git history).
Its results are results/adaptive_batch_v3.* and results/adaptive_batch_v3_*; version 2's
stay as they were recorded, and version 3 reads two of them (below).

Why a third protocol. Version 2's adaptive runs paid a cost that was not the adaptive
batch's: AGS-NS, built for the largest batch and set to the reference batch B = 32, still
split each step into sub-batches and refreshed its gain, 21-41 % a step more than the fixed
run at B = 32 with the same steps (its report's start-overhead table; `adaptive-start-cost`
measured it alone at 30.5 % [10.4, 36.9]). 3e7220a makes AGS take the plain steps there
(`adaptive-start-cost` after it: -2.3 % [-8.9, 11.0]). That fix changes only the adaptive
arm: a fixed run at B = 32 took plain steps before it, and a fixed run above B = 32 scales
as before.

What version 3 keeps of version 2: everything but the scoring seeds, and its plans and
selection runs themselves, which the fix does not touch:
  - the plans: results/adaptive_batch_v2_<workload>.plan.json (`INPUTS_FROM`), read, never
    searched again;
  - the selection: version 2's fixed-B runs on its selection seeds 6-8, read from
    results/adaptive_batch_v2.runs.jsonl; so the best fixed B and the static choice per
    target are version 2's, picked before any run of version 3.

What it changes:
  - every scored arm (adaptive, best fixed, static, M0) again, on the fixed code, on new
    scoring seeds `SCORING_SEEDS`: six, where version 2 had three, since its intervals
    spanned the goals' bounds (the CNN at 80 %: 1.21 [0.98, 1.82]); their order rotates from
    seed to seed, as in version 2;
  - nothing else: the goals, the bounds and the plan row's measure are version 2's.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.accuracy.adaptive_batch_v2_protocol import QUICK as QUICK_V2, ProtocolV2
from benchmarks.accuracy.adaptive_batch_v2_protocol import PROTOCOL as PROTOCOL_V2

PROTOCOL_VERSION = 3
SCORING_SEEDS = (12, 13, 14, 15, 16, 17)  # none of versions 1 and 2's seeds (0-11)
# The recorded run whose plans and selection runs version 3 reads (results/<name>...).
INPUTS_FROM = "adaptive_batch_v2"
INPUTS_VERSION = 2
RESULTS_GLOBS = ("benchmarks/results/adaptive_batch_v3.*",
                 "benchmarks/results/adaptive_batch_v3_*")
RESULTS_NAME = "adaptive_batch_v3"
PROTOCOL_FILE = "benchmarks/accuracy/adaptive_batch_v3_protocol.py"


@dataclass(frozen=True)
class ProtocolV3(ProtocolV2):
    """Version 2's protocol, scored again on new seeds from version 2's plans and
    selection runs (`inputs_from`, `inputs_version`; None: its own, as --quick does)."""

    inputs_from: str | None = INPUTS_FROM
    inputs_version: int | None = INPUTS_VERSION
    protocol_file: str = PROTOCOL_FILE
    version: int = PROTOCOL_VERSION
    scoring_seeds: tuple[int, ...] = SCORING_SEEDS


PROTOCOL = ProtocolV3(PROTOCOL_V2.workloads, selection_seeds=PROTOCOL_V2.selection_seeds)
# --quick, a smoke test of the runner (not a measurement): version 2's, under this version,
# with its own synthetic plan and selection run (no recorded file is read or written).
QUICK = ProtocolV3(QUICK_V2.workloads, selection_seeds=QUICK_V2.selection_seeds,
                   scoring_seeds=QUICK_V2.scoring_seeds, bootstrap=QUICK_V2.bootstrap,
                   total_limit_s=QUICK_V2.total_limit_s, inputs_from=None, inputs_version=None)
