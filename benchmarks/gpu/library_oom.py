"""The acceptance run's check of a CUDA library's allocation failure (issue 46, item 3):
how a cuBLAS handle that cannot get device memory reaches Python, and whether
`tula_ray.failures` reads it as out of memory (not the workload's code).

It runs in a child process of its own: the device's memory is filled there, and a cuBLAS
handle is created only once it is full. torch keeps one cuBLAS handle per thread, so
the child warms a matmul on its main thread (the kernels load, the CUDA context settles),
fills the device, then multiplies on a new thread, whose handle `cublasCreate` must
allocate. The caching allocator is off in the child (PYTORCH_NO_CUDA_MEMORY_CACHING), so
the fill reaches the driver's last free bytes rather than the allocator's 2 MiB blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import torch

CHILD_TIMEOUT_S = 120
SMALLEST_FILL_BYTES = 4096


def _fill(device: torch.device) -> tuple[list[torch.Tensor], int]:
    """Allocations until the device has less than SMALLEST_FILL_BYTES free: halving sizes
    from what it reports free. Returns them (held) and the bytes left free."""
    held, size = [], torch.cuda.mem_get_info(device)[0]
    while size >= SMALLEST_FILL_BYTES:
        try:
            held.append(torch.empty(size, dtype=torch.uint8, device=device))
        except RuntimeError:  # torch.OutOfMemoryError; the size halves
            size //= 2
    return held, torch.cuda.mem_get_info(device)[0]


def _multiply_on_a_new_thread(a: torch.Tensor, out: torch.Tensor) -> BaseException | None:
    caught: list[BaseException] = []

    def multiply() -> None:
        try:  # into `out`, allocated before the fill: only the handle needs new memory
            torch.mm(a, a, out=out)
            torch.cuda.synchronize(out.device)
        except BaseException as error:  # noqa: BLE001 - handed back to the caller
            caught.append(error)

    thread = threading.Thread(target=multiply)
    thread.start()
    thread.join()
    return caught[0] if caught else None


def child() -> dict[str, Any]:
    """In the child process: warm, fill, multiply on a new thread; what was raised."""
    from tula_ray.failures import classify, is_out_of_memory

    device = torch.device("cuda")
    a, out = torch.randn(256, 256, device=device), torch.empty(256, 256, device=device)
    torch.mm(a, a, out=out)  # this thread's handle, the kernels, the context
    torch.cuda.synchronize(device)
    held, free_left = _fill(device)
    error = _multiply_on_a_new_thread(a, out)
    del held
    if error is None:
        return {"caught": None, "free_bytes_left": free_left, "failure": "no error raised"}
    return {"caught": type(error).__name__, "message": str(error).strip().splitlines()[0][:200],
            "free_bytes_left": free_left, "is_out_of_memory": is_out_of_memory(error),
            "failure": classify(error)}


def library_allocation_failure(device: torch.device) -> dict[str, Any]:
    """The child's answer (`child`), or why there is none: no GPU, or the child failed."""
    if device.type != "cuda":
        return {"skipped": "no GPU"}
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.library_oom"], env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"skipped": f"the child did not end within {CHILD_TIMEOUT_S} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"skipped": f"the child failed (exit {done.returncode}): "
                           f"{done.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def report_line(result: dict[str, Any]) -> str:
    """The report's line for the check."""
    if "skipped" in result:
        return f"- A CUDA library's allocation failure (cuBLAS): not checked ({result['skipped']})."
    if result["caught"] is None:
        return ("- A CUDA library's allocation failure (cuBLAS): none raised, the device full "
                f"to {result['free_bytes_left']} bytes.")
    return ("- A CUDA library's allocation failure (cuBLAS's handle on a full device, "
            f"{result['free_bytes_left']} bytes free): {result['caught']}: "
            f"\"{result['message']}\"; is_out_of_memory {result['is_out_of_memory']}, "
            f"read as \"{result['failure']}\".")


if __name__ == "__main__":
    print(json.dumps(child()), flush=True)
