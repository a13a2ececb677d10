"""Teacher-forced, unconstrained token log-probabilities of many sequences sharing a prefix.

The shared prefix (a long few-shot prompt, or the static part of the reverse prompt) is run
once and its KV cache is expanded to every row; only the differing suffixes are batched.
Gradients flow through the shared prefix too, so the result is exact with or without
`share_prefix`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache


@dataclass
class Prefix:
    """A prefix run once: its tokens, per-layer (keys, values) at batch 1, last-position logits."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    last_logits: torch.Tensor  # [1, vocab]

    def cache_for(self, rows: int) -> DynamicCache:
        """A cache holding this prefix for `rows` rows (views; appending copies)."""
        return DynamicCache(ddp_cache_data=[
            (k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.kv])


def encode_prefix(model: torch.nn.Module, tokens: list[int]) -> Prefix:
    """Run `tokens` once and keep its KV cache (reusable only while the weights are unchanged)."""
    ids = torch.tensor([tokens], device=_model_device(model))
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    return Prefix(tokens=list(tokens), kv=kv, last_logits=out.logits[:, -1])


def common_prefix_length(sequences: list[list[int]]) -> int:
    """Length of the longest common prefix of all sequences."""
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for other in sequences[1:]:
        n = 0
        while n < length and other[n] == first[n]:
            n += 1
        length = n
    return length


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[targets] over the full vocabulary (half precisions upcast to float32)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(
    model: torch.nn.Module,
    sequences: list[list[int]],
    score_from: list[int],
    share_prefix: bool = True,
    prefix: Prefix | None = None,
) -> list[torch.Tensor]:
    """Per-token log p(seq[t] | seq[:t]) for t >= score_from[i], for each sequence i.

    With `share_prefix`, the longest common prefix (capped so every scored token stays in
    the suffix) is computed once and its cache shared by all rows. A precomputed `prefix`
    (e.g. a static prompt part under the frozen model) is used instead when given.
    """
    if len(sequences) != len(score_from):
        raise ValueError("sequences and score_from differ in length")
    if any(not 1 <= start < len(seq) + 1 for seq, start in zip(sequences, score_from)):
        raise ValueError("each score_from must be in [1, len(sequence)]")
    device = _model_device(model)
    if prefix is None and share_prefix:
        prefix_len = min(common_prefix_length(sequences), min(score_from))
        prefix = encode_prefix(model, sequences[0][:prefix_len]) if prefix_len > 0 else None
    prefix_len, prefix_logits, cache = 0, None, None
    if prefix is not None:
        prefix_len = len(prefix.tokens)
        if any(seq[:prefix_len] != prefix.tokens or start < prefix_len
               for seq, start in zip(sequences, score_from)):
            raise ValueError("every sequence must start with the given prefix, scored after it")
        prefix_logits = prefix.last_logits  # predicts the first suffix token
        cache = prefix.cache_for(len(sequences))

    suffixes = [seq[prefix_len:] for seq in sequences]
    width = max(len(s) for s in suffixes)
    pad = sequences[0][0]
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in suffixes], device=device)
    valid = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in suffixes], device=device)
    attention = torch.cat([torch.ones(len(suffixes), prefix_len, device=device, dtype=valid.dtype),
                           valid], dim=1)
    positions = (torch.arange(width, device=device) + prefix_len).expand(len(suffixes), -1)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions,
                past_key_values=cache, use_cache=cache is not None)
    logits = out.logits
    if prefix_logits is not None:  # logits predicting suffix token j come from position j-1
        logits = torch.cat([prefix_logits.expand(len(suffixes), -1).unsqueeze(1), logits[:, :-1]], 1)
        token_logp = _gather_logprobs(logits, ids)
        offset = prefix_len
    else:
        token_logp = _gather_logprobs(logits[:, :-1], ids[:, 1:])
        offset = 1
    return [
        token_logp[i, start - offset: len(seq) - offset]
        for i, (seq, start) in enumerate(zip(sequences, score_from))
    ]
