"""KV-cache plumbing for batched decoding with transformers' `DynamicCache`: the copied-rows
layout, where every row holds its own copy of its prompt's KV (as `generate` does).

Each prompt is prefilled once, alone (no padding compute), or once per row without prefix
sharing; its cache is then copied into every row generated from it (N samples, B beams),
left-padded to the longest prompt of the batch. Rows are dropped as they finish and reordered
when beams are re-ranked; columns that every remaining row pads are trimmed away. The default
layout of the decoder keeps the prompt KV once instead (`cascade.SharedPromptCache`); this one
is the unshared reference and the fallback for models cascade attention does not support.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class CopiedPromptCache:
    """A `DynamicCache` with one left-padded copy of its prompt's KV per row, and each row's
    number of left-padding columns."""

    def __init__(self, caches: list[DynamicCache], lengths: list[int], repeats: list[int]):
        width = max(lengths)
        self.cache = assemble(caches, lengths, repeats)
        self.pads = [
            width - length for length, repeat in zip(lengths, repeats) for _ in range(repeat)
        ]

    def attention_mask(self, device: torch.device) -> torch.Tensor:
        """The 2D mask of the next step (cached columns and the new one; padding off)."""
        length = self.cache.get_seq_length() + 1
        pads = torch.tensor(self.pads, device=device)
        return (torch.arange(length, device=device).unsqueeze(0) >= pads.unsqueeze(1)).long()


def layer_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer, each [batch, heads, seq, head_dim]."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def assemble(caches: list[DynamicCache], lengths: list[int], repeats: list[int]) -> DynamicCache:
    """One batched cache: prompt i's cache (batch 1, `lengths[i]` tokens) copied into `repeats[i]`
    consecutive rows, right-aligned (left padding) to the longest prompt."""
    width = max(lengths)
    rows = sum(repeats)
    per_layer = [layer_tensors(c) for c in caches]
    data = []
    for layer_idx in range(len(per_layer[0])):
        k0, v0 = per_layer[0][layer_idx]
        keys = k0.new_zeros((rows, k0.shape[1], width, k0.shape[3]))
        values = v0.new_zeros((rows, v0.shape[1], width, v0.shape[3]))
        start = 0
        for prompt_idx, (length, repeat) in enumerate(zip(lengths, repeats)):
            if repeat == 0:
                continue
            k, v = per_layer[prompt_idx][layer_idx]
            keys[start : start + repeat, :, width - length :] = k
            values[start : start + repeat, :, width - length :] = v
            start += repeat
        data.append((keys, values))
    return DynamicCache(ddp_cache_data=data)


def select_rows(cache: DynamicCache, index: torch.Tensor | None, trim: int) -> None:
    """Keep rows `index` (None: all, in order; duplicates fork a row) and drop the first `trim`
    columns (left padding shared by every kept row), in place."""
    plain = all(type(layer) is DynamicLayer for layer in cache.layers)
    if not plain:  # sliding-window or other layer types: use the public API, no trimming
        if index is not None:
            cache.batch_select_indices(index)
        return
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            continue
        keys, values = layer.keys, layer.values
        if index is not None:
            keys = keys.index_select(0, index)
            values = values.index_select(0, index)
        if trim > 0:
            keys = keys[:, :, trim:]
            values = values[:, :, trim:]
        layer.keys, layer.values = keys, values


def reorder_suffix(cache: DynamicCache, index: torch.Tensor, columns: int) -> bool:
    """Rows take the last `columns` cache columns of rows `index` (same batch size), in place.
    Enough when every row's source shares its prompt (same prompt KV, same padding), as beams
    of one prompt do: only the generated part differs. False if not applicable."""
    if columns <= 0 or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return False
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            continue
        if layer.keys.shape[2] < columns:
            return False
        layer.keys[:, :, -columns:] = layer.keys[:, :, -columns:].index_select(0, index)
        layer.values[:, :, -columns:] = layer.values[:, :, -columns:].index_select(0, index)
    return True


def plan_cache_update(
    old_prompts: list[int], new_prompts: list[int], sources: list[int], trim: int
) -> str:
    """How the batched cache must change between steps, given each slot's prompt before and
    after and the slot each new row continues (`sources`):

    - "keep": every row continues from its own slot;
    - "suffix": only the generated columns move (`reorder_suffix`). Valid only when every slot
      keeps a row of the same prompt, so its prompt KV and padding stay right: beams re-ranked
      within their prompts;
    - "rows": whole rows are gathered (`select_rows`), for any other change.

    (`trim`: left-padding columns dropped, copied rows only. With the shared prompt KV of
    cascade decoding, "suffix" and "rows" both gather the rows' generated KV; each row reads
    the prompt KV of the prompt it belongs to.)
    """
    if sources == list(range(len(old_prompts))):
        return "keep"
    if not trim and old_prompts == new_prompts:
        return "suffix"
    return "rows"
