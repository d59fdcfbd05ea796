"""A GPU node's own check before it joins (cluster.yaml's worker_setup_commands:
`python3 -m tula_ray.cluster.node_check`), issue 45, item 5: the NCCL library the
training process loads must be the one torch was built with (the `nvidia-nccl` wheel in
site-packages). A system libnccl in a directory on LD_LIBRARY_PATH goes ahead of torch's
own (torch finds its libraries by RUNPATH, which LD_LIBRARY_PATH overrides), and a
mismatched NCCL fails or hangs at the first all-reduce, with every GPU of the job held.
The check reads which files the process mapped (/proc/self/maps) after torch loaded NCCL.
Not verified on GPU hardware here (no GPU on the development machine).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tula_ray.distributed import loaded_libraries

TORCHS_OWN = "site-packages"  # where pip put torch and its nvidia-nccl wheel


def check_nccl(loaded: list[str]) -> None:
    """Raises RuntimeError, naming the file and the fix, unless the NCCL loaded is torch's
    own (from site-packages); no NCCL loaded at all is an error too (a CPU build of torch,
    which the check before this one refuses)."""
    if not loaded:
        raise RuntimeError("the training process loaded no libnccl: torch is not a CUDA "
                           "build, or it could not load NCCL (check LD_LIBRARY_PATH)")
    foreign = [path for path in loaded if TORCHS_OWN not in Path(path).parts]
    if foreign:
        raise RuntimeError(f"the training process loads NCCL from {', '.join(foreign)}, not "
                           "the one torch was built with (site-packages/nvidia/nccl): a "
                           "system libnccl on LD_LIBRARY_PATH goes ahead of torch's; take its "
                           "directory out of LD_LIBRARY_PATH on this node")


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing to check", file=sys.stderr)
        return 0
    print(f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")  # loads it
    try:
        check_nccl(loaded_libraries(Path("/proc/self/maps").read_text()))
    except RuntimeError as error:
        print(f"tula-ray node check: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
