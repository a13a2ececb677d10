"""Wall-clock reads for phase timings. CUDA runs kernels asynchronously: a host clock read while
they are queued charges their time to whichever later phase waits for them first. On CUDA the
clock therefore waits for the queued work before it reads; on CPU it reads at once."""

from __future__ import annotations

import time

import torch


def cuda_in_use() -> bool:
    """CUDA is available and this process has started using it (a CPU run on a GPU machine
    never initialises it: reading the clock does not either)."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def synchronize() -> None:
    """Wait for the work queued on the current CUDA device (nothing to wait for on CPU)."""
    if cuda_in_use():
        torch.cuda.synchronize()


def clock() -> float:
    """`time.perf_counter()` once the queued device work has finished."""
    synchronize()
    return time.perf_counter()
