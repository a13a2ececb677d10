"""Teacher-forced, unconstrained token log-probabilities of many sequences sharing a prefix.

The shared prefix (a long few-shot prompt, or the static part of the reverse prompt) is run
once: the differing suffixes are packed after it into one row, each attending to the prefix
and to its own earlier tokens only (a block mask; positions restart after the prefix). So the
prompt's activations and keys exist once, not once per candidate, with or without gradient.
Gradients flow through the shared prefix too, so the result is exact with or without
`share_prefix`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from grammarrl.models.loading import output_kv_cache, with_kv_cache


@dataclass
class Prefix:
    """A prefix run once: its tokens, per-layer (keys, values) at batch 1, last-position logits."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    last_logits: torch.Tensor  # [1, vocab]

    def cache(self) -> DynamicCache:
        """A fresh batch-1 cache holding this prefix (appending copies; the prefix is kept)."""
        return DynamicCache(ddp_cache_data=list(self.kv))


def encode_prefix(model: torch.nn.Module, tokens: list[int]) -> Prefix:
    """Run `tokens` once and keep its KV cache (reusable only while the weights are unchanged)."""
    ids = torch.tensor([tokens], device=_model_device(model))
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    kv = [(layer.keys, layer.values) for layer in output_kv_cache(out).layers]
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
    """Per-token log p(seq[t] | seq[:t]) for t >= score_from[i], for each sequence i (an empty
    tensor where nothing is scored: score_from[i] == len(seq), e.g. an empty candidate).

    With `share_prefix`, the longest common prefix (capped so every scored token stays in
    the suffix) is run once and the suffixes are packed after it. A precomputed `prefix`
    (e.g. a static prompt part under the frozen model) is read from its cache, and with
    `share_prefix` the rest of the common prefix is run once after it. Without either, every
    sequence is a padded row of its own.
    """
    if len(sequences) != len(score_from):
        raise ValueError("sequences and score_from differ in length")
    if any(not 1 <= start < len(seq) + 1 for seq, start in zip(sequences, score_from)):
        raise ValueError("each score_from must be in [1, len(sequence)]")
    cached = len(prefix.tokens) if prefix is not None else 0
    if prefix is not None and any(
        seq[:cached] != prefix.tokens or start < cached for seq, start in zip(sequences, score_from)
    ):
        raise ValueError("every sequence must start with the given prefix, scored after it")
    if prefix is None and not share_prefix:
        return _padded_logprobs(model, sequences, score_from)
    shared = _shared_length(sequences, score_from, share_prefix, cached)
    return _packed_logprobs(
        model,
        sequences[0][cached:shared],
        [seq[shared:] for seq in sequences],
        [start - shared for start in score_from],
        prefix,
    )


def _shared_length(
    sequences: list[list[int]], score_from: list[int], share_prefix: bool, cached: int
) -> int:
    """Where the packed suffixes start: the tokens before are run once (or read from the cached
    prefix of length `cached`); capped so every scored token stays in a suffix."""
    return min(common_prefix_length(sequences), min(score_from)) if share_prefix else cached


def positions_run(
    sequences: list[list[int]],
    score_from: list[int],
    share_prefix: bool = True,
    prefix: Prefix | None = None,
) -> int:
    """Token positions the model runs for `sequence_logprobs` with the same arguments (a cached
    prefix is not run; padded rows count their padding)."""
    if prefix is None and not share_prefix:
        return len(sequences) * max(len(seq) for seq in sequences)
    cached = len(prefix.tokens) if prefix is not None else 0
    shared = _shared_length(sequences, score_from, share_prefix, cached)
    return shared - cached + sum(len(seq) - shared for seq in sequences)


def _padded_logprobs(
    model: torch.nn.Module, sequences: list[list[int]], score_from: list[int]
) -> list[torch.Tensor]:
    """One right-padded row per sequence, no sharing."""
    device = _model_device(model)
    width = max(len(s) for s in sequences)
    pad = sequences[0][0]
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences], device=device)
    valid = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences], device=device)
    token_logp = _gather_logprobs(
        model(input_ids=ids, attention_mask=valid).logits[:, :-1], ids[:, 1:]
    )
    return [
        token_logp[i, start - 1 : len(seq) - 1]
        for i, (seq, start) in enumerate(zip(sequences, score_from))
    ]


def _packed_logprobs(
    model: torch.nn.Module,
    head: list[int],
    suffixes: list[list[int]],
    starts: list[int],
    cached: Prefix | None,
) -> list[torch.Tensor]:
    """Log-probs of suffixes[i][starts[i]:] after a shared prefix: `cached` (already run,
    read from its cache) followed by `head` (run here), with the suffixes packed into one row.

    A suffix token at index j is predicted by the same suffix's position j-1, or for j = 0 by
    the prefix's last position."""
    device = _model_device(model)
    dtype = next(model.parameters()).dtype
    past = len(cached.tokens) if cached is not None else 0
    offset = past + len(head)  # where every suffix starts in its sequence
    ids, positions, segment = list(head), list(range(past, offset)), [-1] * len(head)
    for row, suffix in enumerate(suffixes):
        ids += suffix
        positions += range(offset, offset + len(suffix))
        segment += [row] * len(suffix)
    seg = torch.tensor(segment, device=device)
    index = torch.arange(len(ids), device=device)
    visible = (index[None, :] <= index[:, None]) & (
        (seg[None, :] == -1) | (seg[None, :] == seg[:, None])
    )
    visible = torch.cat([torch.ones(len(ids), past, dtype=torch.bool, device=device), visible], 1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(
        ~visible, torch.finfo(dtype).min
    )[None, None]  # additive: works for sdpa and eager
    packed = len(ids) - len(head)
    keep = packed + (1 if head else 0)  # the prefix's last position predicts each first token
    out = model(
        input_ids=torch.tensor([ids], device=device),
        attention_mask=mask,
        position_ids=torch.tensor([positions], device=device),
        **with_kv_cache(cached.cache() if cached is not None else None),
        use_cache=cached is not None,
        logits_to_keep=keep,
    )
    logits = out.logits[0]
    if head:
        before, logits = logits[:1], logits[1:]
    else:
        before = cached.last_logits if cached is not None else None
    predictors, targets, lengths, at = [], [], [], 0
    for suffix, start in zip(suffixes, starts):
        rows = logits[at + max(start - 1, 0) : at + max(len(suffix) - 1, 0)]
        if start == 0 and suffix:
            if before is None:
                raise ValueError("a first token cannot be scored without a prefix")
            rows = torch.cat([before, rows])
        predictors.append(rows)
        targets += suffix[start:]
        lengths.append(len(suffix) - start)
        at += len(suffix)
    token_logp = _gather_logprobs(torch.cat(predictors), torch.tensor(targets, device=device))
    return list(token_logp.split(lengths))
