"""The model side of the constrained decoder: prefill, the batch's KV cache, one decode step.

`ModelForward` (the base class of `decoder.ConstrainedDecoder`) runs the model. Each prompt is
prefilled once (a prefix common to all prompts of a call once in all) and its KV kept once per
prompt, read by every row through cascade attention (`cascade.py`), or copied into every row
(`cache.CopiedPromptCache`: models cascade attention does not support, `share_prefix=False`).
Between steps the cache follows the rows (dropped, reordered, forked). Forward calls and token
positions run are counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import DynamicCache

from grammarrl.decoding.cache import (
    CopiedPromptCache,
    layer_tensors,
    plan_cache_update,
    reorder_suffix,
    select_rows,
)
from grammarrl.decoding.cascade import (
    CACHE_KWARG,
    SharedPromptCache,
    cascade_attention,
    model_configs,
    supports_cascade,
)
from grammarrl.decoding.rows import Row
from grammarrl.models.loading import output_kv_cache, with_kv_cache


class ModelForward:
    """Prefill and decode steps of `model` over a batch of rows, their KV cache laid out by
    `share_prefix` and `cascade` (see `ConstrainedDecoder`)."""

    def __init__(
        self, model: torch.nn.Module, max_new_tokens: int, share_prefix: bool, cascade: bool | None
    ) -> None:
        self.model = model
        self.max_new_tokens = int(max_new_tokens)
        self._configs: list | None = None  # the model's configs, for the attention switch
        # Prompts of one call sharing at least this many leading tokens prefill them once.
        self.min_shared_prefix = 32
        # False: every row prefills its own prompt, as `generate(num_return_sequences=...)` does
        # (the reference point of the sharing benchmark; same outputs, more compute).
        self.share_prefix = share_prefix
        # With prefix sharing, keep each prompt's KV once and decode with cascade attention
        # (None: wherever the model supports it; False: copy the prompt KV into every row, the
        # layout of `share_prefix=False`, same outputs; True: required).
        self.cascade = cascade
        # Cost accounting: model forward calls and token positions run (prefill tokens + one per
        # decoded row per step), accumulated over the decoder's life; read and diff freely.
        self.forward_calls = 0
        self.forward_tokens = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """One decoding call: the model in eval and inference mode, its mode restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            if was_training:
                self.model.train()

    def _forward(self, input_ids, attention_mask, position_ids, cache, last_only=False, **kwargs):
        if last_only:
            kwargs["logits_to_keep"] = 1
        self.forward_calls += 1
        self.forward_tokens += int(input_ids.numel())
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **with_kv_cache(cache),
            **kwargs,
        )
        return out.logits[:, -1, :].float(), output_kv_cache(out)

    def _prefill(
        self, prompt: list[int], prefix: tuple[int, list] | None = None
    ) -> tuple[torch.Tensor, DynamicCache]:
        """Last-position logits and the KV cache of `prompt`; `prefix` = (length, per-layer
        (keys, values)) of an already computed first part of it, continued from a copy."""
        device = self.device
        start, cache = 0, DynamicCache()
        if prefix is not None:
            start, tensors = prefix
            cache = DynamicCache(ddp_cache_data=tensors)  # copies: the prefix stays intact
        ids = torch.tensor([prompt[start:]], dtype=torch.long, device=device)
        mask = torch.ones((1, len(prompt)), dtype=torch.long, device=device)
        positions = torch.arange(start, len(prompt), device=device).unsqueeze(0)
        return self._forward(ids, mask, positions, cache, last_only=True)

    def _shared_prefix(self, prompts: list[list[int]]) -> tuple[int, list] | None:
        """The KV cache of the longest common prefix of the prompts of this call (a static
        system prompt, hierarchy, demonstrations), computed once; None if too short. Never
        reused across calls: the model's weights may have changed in between."""
        if len(prompts) < 2:
            return None
        first = prompts[0]
        shared = min(len(p) for p in prompts) - 1  # keep >= 1 token per prompt to prefill
        for p in prompts[1:]:
            n = 0
            limit = min(shared, len(p))
            while n < limit and p[n] == first[n]:
                n += 1
            shared = n
            if shared < self.min_shared_prefix:
                return None
        _, cache = self._prefill(first[:shared])
        return shared, layer_tensors(cache)

    def advance(self, kv, rows: list[Row], new_rows: list[Row], sources: list[int]) -> torch.Tensor:
        """The next step: new row i continues `rows[sources[i]]` (rows dropped, reordered or
        forked); the cache follows, then one decode step. The new rows' logits [R', V]."""
        self._reorder(
            kv,
            [r.prompt for r in rows],
            [r.prompt for r in new_rows],
            sources,
            len(new_rows[0].tokens) - 1,
        )
        return self._step(kv, new_rows)

    def start(
        self, prompts: list[list[int]], rows_per_prompt: int
    ) -> tuple[torch.Tensor, SharedPromptCache | CopiedPromptCache]:
        """Prefill the prompts: the first logits of every row (rows of a prompt consecutive,
        `rows_per_prompt` each) and the batch's KV cache. With prefix sharing each prompt is run
        once (a common prefix of the prompts once in all) and its KV kept once (cascade) or
        copied into its rows; without, every row prefills its own prompt."""
        prefix = self._shared_prefix(prompts) if self.share_prefix else None
        copies = 1 if self.share_prefix else rows_per_prompt  # prefills per prompt
        first_logits, caches, lengths, repeats = [], [], [], []
        for prompt in prompts:
            for _ in range(copies):
                logits, cache = self._prefill(prompt, prefix)
                first_logits.append(logits.expand(rows_per_prompt // copies, -1))
                caches.append(cache)
                lengths.append(len(prompt))
                repeats.append(rows_per_prompt // copies)
        del prefix
        logits = torch.cat(first_logits, dim=0)
        if not self._use_cascade():
            return logits, CopiedPromptCache(caches, lengths, repeats)
        self._configs = model_configs(self.model)
        kv = SharedPromptCache(
            [layer_tensors(c) for c in caches], capacity=min(self.max_new_tokens + 1, 64)
        )
        kv.select([p for p in range(len(prompts)) for _ in range(rows_per_prompt)])
        return logits, kv

    def _use_cascade(self) -> bool:
        if not self.share_prefix or self.cascade is False:
            return False
        supported = supports_cascade(self.model)
        if self.cascade and not supported:
            raise ValueError(
                "cascade=True, but the model's attention cannot be replaced by "
                "cascade attention (see grammarrl/decoding/cascade.py)"
            )
        return supported

    def _reorder(
        self, kv, old_prompts: list[int], new_prompts: list[int], sources: list[int], generated: int
    ) -> None:
        """Rows of the next step: new row i continues old row `sources[i]` (dropped, reordered
        or forked rows); `generated` = tokens already in the cache per row."""
        if isinstance(kv, SharedPromptCache):
            plan = plan_cache_update(old_prompts, new_prompts, sources, 0)
            kv.select(new_prompts, None if plan == "keep" else sources)
            return
        # Copied rows: also trim the left padding no row needs any more.
        trim = min(kv.pads[s] for s in sources)
        plan = plan_cache_update(old_prompts, new_prompts, sources, trim)
        device = self.device
        if plan == "suffix" and not reorder_suffix(
            kv.cache, torch.tensor(sources, device=device), generated
        ):
            plan = "rows"
        if plan == "rows" or trim:
            index = None if plan == "keep" else torch.tensor(sources, device=device)
            select_rows(kv.cache, index, trim)
        kv.pads = [kv.pads[s] - trim for s in sources]

    def _step(self, kv, rows: list[Row]) -> torch.Tensor:
        """One decode step of `rows` (each feeds its last token): next-token logits."""
        device = self.device
        input_ids = torch.tensor([[r.tokens[-1]] for r in rows], device=device)
        positions = torch.tensor([[r.plen + len(r.tokens) - 1] for r in rows], device=device)
        if isinstance(kv, SharedPromptCache):
            with cascade_attention(self._configs):
                logits, _ = self._forward(input_ids, None, positions, kv, **{CACHE_KWARG: kv})
            return logits
        logits, kv.cache = self._forward(input_ids, kv.attention_mask(device), positions, kv.cache)
        return logits
