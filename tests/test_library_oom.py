"""gpu-acceptance's check of a CUDA library's allocation failure (issue 46, item 3), the parts
that run without a GPU: the multiply on a thread of its own (torch keeps a cuBLAS handle per
thread, so only a new thread's handle is created on the full device), what it hands back,
and the report's line for each outcome."""

import threading

import torch

from benchmarks.gpu import library_oom


def test_the_multiply_runs_on_a_new_thread_and_hands_back_what_it_raised(monkeypatch):
    threads = []
    real_mm = torch.mm

    def recording_mm(*args, **kwargs):
        threads.append(threading.get_ident())
        return real_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "mm", recording_mm)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    a = torch.randn(4, 4)
    assert library_oom._multiply_on_a_new_thread(a, torch.empty(4, 4)) is None
    assert threads and threads[0] != threading.get_ident()
    error = library_oom._multiply_on_a_new_thread(a, torch.empty(3, 3, dtype=torch.int64))
    assert isinstance(error, RuntimeError)  # raised on the thread, handed back, not lost


def test_without_a_gpu_the_check_is_skipped_and_says_so():
    result = library_oom.library_allocation_failure(torch.device("cpu"))
    assert result == {"skipped": "no GPU"}
    assert library_oom.report_line(result) == (
        "- A CUDA library's allocation failure (cuBLAS): not checked (no GPU).")


def test_the_report_names_the_class_the_message_and_how_tula_ray_read_it():
    caught = {"caught": "RuntimeError", "free_bytes_left": 2048,
              "message": "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                         "`cublasCreate(handle)`", "is_out_of_memory": True, "failure": "oom"}
    line = library_oom.report_line(caught)
    assert "RuntimeError: \"CUDA error: CUBLAS_STATUS_ALLOC_FAILED" in line
    assert "2048 bytes free" in line and line.endswith('read as "oom".')
    none = library_oom.report_line({"caught": None, "free_bytes_left": 0,
                                    "failure": "no error raised"})
    assert "none raised" in none
