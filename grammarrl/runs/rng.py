"""Random states in training checkpoints: the global generators (torch CPU and CUDA, numpy,
Python) as checkpointable data, gathered from every rank, so that a resumed run continues the
exact random stream of an uninterrupted one. (Lightning's own collectors are private, and
checkpoints written in this format must keep resuming.)"""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
import torch


def gather_objects(obj: Any) -> list[Any]:
    """`obj` of every rank, by rank (a list of one without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    buffer = io.BytesIO()
    torch.save(obj, buffer)  # tensors as torch serialises them (pickling their storage fails)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, buffer.getvalue())
    return [torch.load(io.BytesIO(data), weights_only=False) for data in gathered]


def rng_states() -> dict[str, Any]:
    """The global random states (torch CPU and CUDA, numpy, Python) as checkpointable data."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
        "python": random.getstate(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore the global random states `rng_states` returned."""
    torch.set_rng_state(states["torch"])
    if states.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    name, keys, *rest = states["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
