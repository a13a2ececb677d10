"""The shared CUDA skip marker and device parameters of the CUDA-vs-CPU parity tests."""

from __future__ import annotations

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ON_CUDA = [pytest.mark.cuda, requires_cuda]
# Each parity test runs on "cpu" too (CPU against itself: the comparison's plumbing, in the
# ordinary suite) and on "cuda" (marked `cuda`: `pytest -m cuda`, skipped without a GPU).
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", marks=ON_CUDA, id="cuda")]
