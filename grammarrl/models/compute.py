"""Training compute, counted the same way for every objective: model forward calls."""

from __future__ import annotations

from typing import Any

import torch


class ForwardCounter:
    """Counts the calls of a model's forward and the token positions they run (`input_ids`
    elements), whoever makes them: the decoder, the reference (the same model with its
    adapter disabled), the potentials and the loss's log-prob pass. Activation
    checkpointing's recomputation in backward runs the layers, not this forward: not counted."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self.tokens = 0
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls += 1
        self.tokens += int(ids.numel()) if isinstance(ids, torch.Tensor) else 0
