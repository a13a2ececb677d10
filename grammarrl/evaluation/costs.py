"""Cost accounting of a scoring job (mode=eval, mode=search, a training run's test evaluations):
model forward token positions per output, wall seconds, and the machine that ran them.

A token position is one `input_ids` element run by the model: a prompt's prefill counts its
tokens (a prefix shared by the prompts of a decoding call once), each decode step one per live
row. Generation is counted by the decoder (`ModelForward.forward_tokens`), a search's potential
by the potential, and the reward-scoring pass of `eval.score_rewards` (the reference's rewards
of the outputs: a measurement, not part of producing them) by a `ForwardCounter` on the model.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import torch

from grammarrl.models.compute import ForwardCounter
from grammarrl.runs.timing import clock

_COUNTERS: WeakKeyDictionary[torch.nn.Module, ForwardCounter] = WeakKeyDictionary()


@dataclass
class Pass:
    """What one counted pass ran: forward token positions and wall seconds."""

    tokens: int = 0
    seconds: float = 0.0


def _counter(model: torch.nn.Module) -> ForwardCounter:
    """The model's one forward counter (its hook registered once, however often it is read)."""
    if model not in _COUNTERS:
        _COUNTERS[model] = ForwardCounter(model)
    return _COUNTERS[model]


@contextlib.contextmanager
def counted(model: torch.nn.Module) -> Iterator[Pass]:
    """The forward token positions every call of `model` runs inside the block, and its wall
    seconds (after the queued device work), in the `Pass` it yields, filled on exit."""
    counter = _counter(model)
    found = Pass()
    tokens, started = counter.tokens, clock()
    try:
        yield found
    finally:
        found.tokens, found.seconds = counter.tokens - tokens, clock() - started


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows of it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine(device: torch.device | str | None = None) -> dict[str, Any]:
    """The machine numbers come from: CPU model, cores, torch's threads, and the GPU's name
    where `device` is a CUDA device (None: wherever CUDA is available)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if cuda:
        info["cuda_device"] = torch.cuda.get_device_name(device)
    return info


def per_output(tokens: int, outputs: int) -> float | None:
    """Forward token positions per output (None without outputs)."""
    return tokens / outputs if outputs else None


def cost_fields(
    outputs: int,
    generation_tokens: int,
    rewards: Pass,
    device: torch.device | str,
    potential_tokens: int | None = None,
) -> dict[str, Any]:
    """The cost fields of a results record (`outputs` distinct outputs of one decoding pass or
    search draw): `forward_tokens` of generation, `potential_forward_tokens` of a search's
    potential (searches only), `reward_forward_tokens` and `reward_seconds` of the
    `eval.score_rewards` pass (0 when not run), each count also `_per_output`, and `machine`."""
    counts = {"forward_tokens": generation_tokens}
    if potential_tokens is not None:
        counts["potential_forward_tokens"] = potential_tokens
    counts["reward_forward_tokens"] = rewards.tokens
    fields: dict[str, Any] = {}
    for name, tokens in counts.items():
        fields[name] = tokens
        fields[f"{name}_per_output"] = per_output(tokens, outputs)
    return {**fields, "reward_seconds": rewards.seconds, "machine": machine(device)}
