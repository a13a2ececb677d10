"""Cascade attention: decode many rows against ONE copy of their prompt's KV cache.

A rollout group decodes N samples and B beams of one prompt together. Copying the prompt's keys
and values into every row (as `generate(num_return_sequences=...)` and a batched `DynamicCache`
do) makes each decode step read, and `torch.cat` rewrite, N+B copies of a ~1k-token prompt.
Here the KV cache of a decoding batch has two levels, as in FlashInfer's cascade attention and
the prefix sharing of vLLM / SGLang:

- the **prompt level**: each prompt's keys and values once ([prompts, kv_heads, length, dim],
  right-padded to the longest prompt, with an additive mask where lengths differ);
- the **row level**: the keys and values of the tokens each row generated, in a buffer that
  grows by doubling ([rows, kv_heads, capacity, dim]; every live row has generated the same
  number of tokens, so no padding). Forking, reordering and dropping rows (beams, finished
  rows, SMC resampling) gathers these small buffers only.

Attention of a decode step splits accordingly. The queries of all rows of a prompt (and, with
grouped-query attention, all query heads of a key/value head) attend to the prompt's KV in one
batched call; each row's query attends to its own generated KV in a second; the two partial
results are merged exactly by their log-sum-exp (FlashInfer's "merge states"):

    out = out_p * exp(lse_p - lse) + out_r * exp(lse_r - lse),   lse = logaddexp(lse_p, lse_r)

The partial attentions come from torch's CPU flash-attention kernel, which returns the
log-sum-exp; on other devices from an explicit float32 computation (the decode step has one
query per row, so this is small next to the weights).

The model runs its own projections, rotary embeddings and MLPs unchanged; only the attention
function is replaced, through transformers' `AttentionInterface`, and only for the decode
forwards (`cascade_attention(model)` switches the model's attention implementation around one
call and restores it). Models whose attention is not plain causal full attention (sliding
windows, soft-capping, models outside the attention interface) are refused by
`supports_cascade`; the decoder then copies the prompt KV per row as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel

ATTENTION_NAME = "grammarrl_cascade"
CACHE_KWARG = "grammarrl_cascade_cache"  # the model kwarg that carries the cache to attention


# Attention arguments of other architectures that change the softmax (windows, soft-capping,
# attention sinks, position biases): cascade attention refuses them rather than ignore them.
_NOT_SUPPORTED = ("sliding_window", "softcap", "s_aux", "sinks", "position_bias")


def _cascade_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: `key` / `value` are the rows' generated KV (what
    `SharedPromptCache.update` returned); the prompt KV comes from the cache itself."""
    cache = kwargs.get(CACHE_KWARG)
    if cache is None:
        raise RuntimeError(
            f"{ATTENTION_NAME} attention runs only with a SharedPromptCache "
            f"passed as `{CACHE_KWARG}` (decode steps of the constrained decoder)"
        )
    extra = [k for k in _NOT_SUPPORTED if kwargs.get(k) is not None]
    if extra:
        raise RuntimeError(
            f"{ATTENTION_NAME} attention supports plain causal attention only, "
            f"not {', '.join(extra)}"
        )
    if dropout:
        raise RuntimeError(f"{ATTENTION_NAME} attention is for inference (dropout must be 0)")
    scale = module.head_dim**-0.5 if scaling is None else scaling
    return cache.attend(module.layer_idx, query, key, value, scale), None


AttentionInterface.register(ATTENTION_NAME, _cascade_attention_forward)


def model_configs(model: torch.nn.Module) -> list[PretrainedConfig]:
    """Every distinct transformers config reachable from `model`'s modules (a PEFT or other
    wrapper around the HF model included)."""
    seen: dict[int, PretrainedConfig] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            seen.setdefault(id(config), config)
    return list(seen.values())


def supports_cascade(model: torch.nn.Module) -> bool:
    """Whether the model's attention can be replaced by cascade attention: a transformers model
    following the attention interface, with causal full attention in every layer (no sliding
    window, no logit soft-capping, not an encoder-decoder)."""
    hf_models = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    if not hf_models:
        return False
    for m in hf_models:  # transformers' flags for models that call the attention interface
        if not getattr(m, "_supports_attention_backend", False):
            return False
        can_set = getattr(type(m), "_can_set_attn_implementation", None)
        if can_set is not None and not can_set():
            return False
    for config in model_configs(model):
        if getattr(config, "is_encoder_decoder", False) or not getattr(config, "is_causal", True):
            return False
        if getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", False):
            return False
        if getattr(config, "attn_logit_softcapping", None) is not None:
            return False
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            return False
    return True


@contextmanager
def cascade_attention(configs: list[PretrainedConfig]) -> Iterator[None]:
    """Within the block, the attention layers of a model with these configs (`model_configs`)
    use cascade attention; their implementation is restored after."""
    before = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = ATTENTION_NAME
        yield
    finally:
        for config, name in zip(configs, before):
            config._attn_implementation = name


try:  # torch's CPU flash-attention kernel, which also returns the log-sum-exp (torch >= 2.2)
    _CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
except (AttributeError, RuntimeError):
    _CPU_FLASH = None
_CPU_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def uses_cpu_flash(device_type: str, dtype: torch.dtype, exact_fp32: bool = False) -> bool:
    """Whether `attention_with_lse` runs torch's CPU flash kernel for queries on `device_type`
    in `dtype`: on CPU unless `exact_fp32`; on CUDA (and elsewhere) the explicit float32 path."""
    return (
        _CPU_FLASH is not None
        and device_type == "cpu"
        and not exact_fp32
        and dtype in _CPU_FLASH_DTYPES
    )


def attention_with_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    exact_fp32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp: (out [B, H, Q, D] float32, lse [B, H, Q] float32)
    for query [B, H, Q, D], key / value [B, H, K, D] and an additive mask broadcastable to
    [B, H, Q, K]. On CPU torch's flash-attention kernel (it returns the log-sum-exp); elsewhere,
    or with `exact_fp32`, an explicit float32 computation."""
    if uses_cpu_flash(query.device.type, query.dtype, exact_fp32):
        out, lse = _CPU_FLASH(query, key, value, 0.0, False, attn_mask=mask, scale=scale)
        return out.float(), lse.float()
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), value.float())
    return out, lse


def merge_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """The attention over the union of two disjoint key sets from the attention over each
    (float32 outputs [..., D] and their log-sum-exps [...])."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse).unsqueeze(-1) + out_b * torch.exp(lse_b - lse).unsqueeze(
        -1
    )


class SharedPromptCache:
    """The KV cache of a decoding batch whose rows share their prompt's KV (see the module doc).

    Built from each prompt's per-layer (keys, values) at batch 1; `select` then says, before each
    decode step, which prompt every row belongs to and which old row it continues. It is passed
    to the model both as its KV cache (the model's attention layers `update` it with the
    step's keys and values) and as the `CACHE_KWARG` keyword that reaches the attention function.
    """

    exact_fp32 = False  # tests: force the explicit float32 attention on CPU too

    def __init__(
        self, prompt_kv: list[list[tuple[torch.Tensor, torch.Tensor]]], capacity: int = 32
    ):
        if not prompt_kv:
            raise ValueError("no prompts")
        self.num_layers = len(prompt_kv[0])
        self.lengths = [int(layers[0][0].shape[2]) for layers in prompt_kv]
        self._prompt_kv = prompt_kv  # released once stacked
        self._slots: list[int] = list(range(len(prompt_kv)))  # prompt id of each stacked slot
        self._stack(self._slots)
        self._prompt_kv = None
        self.capacity = max(1, int(capacity))  # first allocation of the row buffers
        self.keys: list[torch.Tensor | None] = [None] * self.num_layers
        self.values: list[torch.Tensor | None] = [None] * self.num_layers
        self.filled = [0] * self.num_layers  # generated columns held per layer
        self._row_prompts: list[int] = []
        self._gather: torch.Tensor | None = None
        self._scatter: torch.Tensor | None = None
        self._queries_per_slot = 0

    # ------------------------------------------------------------------ rows and prompts

    def _stack(self, slots: list[int], previous: list[int] | None = None) -> None:
        """(Re)build the prompt level for prompts `slots` (their order is the slot order)."""
        width = max(self.lengths[p] for p in slots)
        if previous is None:  # from the per-prompt tensors
            if len(slots) == 1:
                self.prefix_keys = [k for k, _ in self._prompt_kv[slots[0]]]
                self.prefix_values = [v for _, v in self._prompt_kv[slots[0]]]
            else:
                self.prefix_keys, self.prefix_values = [], []
                for layer in range(self.num_layers):
                    k0 = self._prompt_kv[slots[0]][layer][0]
                    shape = (len(slots), k0.shape[1], width, k0.shape[3])
                    keys, values = k0.new_zeros(shape), k0.new_zeros(shape)
                    for s, p in enumerate(slots):
                        k, v = self._prompt_kv[p][layer]
                        keys[s, :, : k.shape[2]] = k[0]
                        values[s, :, : v.shape[2]] = v[0]
                    self.prefix_keys.append(keys)
                    self.prefix_values.append(values)
        else:  # keep a subset of the stacked slots
            index = torch.tensor(
                [previous.index(p) for p in slots], device=self.prefix_keys[0].device
            )
            self.prefix_keys = [k[:, :, :width].index_select(0, index) for k in self.prefix_keys]
            self.prefix_values = [
                v[:, :, :width].index_select(0, index) for v in self.prefix_values
            ]
        self._slots = list(slots)
        lengths = [self.lengths[p] for p in slots]
        self.prefix_mask = None
        if min(lengths) != width:
            ref = self.prefix_keys[0]
            columns = torch.arange(width, device=ref.device)
            valid = columns.unsqueeze(0) < torch.tensor(lengths, device=ref.device).unsqueeze(1)
            mask = torch.zeros(valid.shape, dtype=ref.dtype, device=ref.device)
            self.prefix_mask = mask.masked_fill_(~valid, float("-inf"))[:, None, None, :]

    def select(self, row_prompts: list[int], sources: list[int] | None = None) -> None:
        """Set the rows of the next step: row i belongs to prompt `row_prompts[i]` and continues
        old row `sources[i]` (None: the same rows as before, in order). Rows may be dropped,
        reordered or repeated (forks); a prompt without rows leaves the prompt level."""
        if sources is not None:
            if not sources:
                raise ValueError("no rows")
            device = self.prefix_keys[0].device
            index = torch.tensor(sources, device=device)
            for layer in range(self.num_layers):
                if self.keys[layer] is not None:
                    self.keys[layer] = self.keys[layer].index_select(0, index)
                    self.values[layer] = self.values[layer].index_select(0, index)
        if row_prompts == self._row_prompts:
            return
        self._row_prompts = list(row_prompts)
        present = set(row_prompts)
        live = [p for p in self._slots if p in present]
        if live != self._slots:
            self._stack(live, previous=self._slots)
        slot_of = {p: s for s, p in enumerate(self._slots)}
        members: list[list[int]] = [[] for _ in self._slots]
        for row, p in enumerate(row_prompts):
            members[slot_of[p]].append(row)
        per_slot = max(len(m) for m in members)
        self._queries_per_slot = per_slot
        if len(members) == 1:  # every row reads the one prompt: no gather
            self._gather = self._scatter = None
            return
        gather, scatter = [], [0] * len(row_prompts)
        for s, rows in enumerate(members):
            for j, row in enumerate(rows):
                scatter[row] = s * per_slot + j
            gather += rows + [rows[0]] * (per_slot - len(rows))  # padding queries: ignored
        device = self.prefix_keys[0].device
        self._gather = torch.tensor(gather, device=device)
        self._scatter = torch.tensor(scatter, device=device)

    # ------------------------------------------------------------------ the model's side

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths[p] for p in self._slots) + self.filled[layer_idx]

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one decode step's keys and values ([rows, kv_heads, 1, dim]); returns the rows'
        generated keys and values so far (views [rows, kv_heads, filled, dim])."""
        if key_states.shape[2] != 1:
            raise ValueError("SharedPromptCache appends one token per row and step")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        n = self.filled[layer_idx]
        rows, heads, _, dim = key_states.shape
        if keys is None:
            shape = (rows, heads, self.capacity, dim)
            keys, values = key_states.new_empty(shape), value_states.new_empty(shape)
        elif keys.shape[0] != rows:
            raise ValueError(f"{rows} rows fed to a cache holding {keys.shape[0]}: call select")
        elif n == keys.shape[2]:  # full: double the capacity
            keys = torch.cat([keys, torch.empty_like(keys)], dim=2)
            values = torch.cat([values, torch.empty_like(values)], dim=2)
        keys[:, :, n] = key_states[:, :, 0]
        values[:, :, n] = value_states[:, :, 0]
        self.keys[layer_idx], self.values[layer_idx] = keys, values
        self.filled[layer_idx] = n + 1
        return keys[:, :, : n + 1], values[:, :, : n + 1]

    def attend(
        self,
        layer_idx: int,
        query: torch.Tensor,
        row_keys: torch.Tensor,
        row_values: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Attention output [rows, 1, heads, dim] of queries [rows, heads, 1, dim] over each
        row's prompt KV and its own generated KV."""
        rows, heads, q_len, dim = query.shape
        if q_len != 1:
            raise ValueError("cascade attention decodes one token per row")
        kv_heads = row_keys.shape[1]
        group = heads // kv_heads
        q = query.reshape(rows, kv_heads, group, dim)  # query heads of one KV head together
        exact = self.exact_fp32
        out_r, lse_r = attention_with_lse(q, row_keys, row_values, None, scale, exact)

        # Prompt level: the queries of a prompt's rows side by side, one batch entry per prompt.
        slots, per_slot = len(self._slots), self._queries_per_slot
        grouped = q if self._gather is None else q.index_select(0, self._gather)
        grouped = grouped.reshape(slots, per_slot, kv_heads, group, dim).transpose(1, 2)
        grouped = grouped.reshape(slots, kv_heads, per_slot * group, dim)
        out_p, lse_p = attention_with_lse(
            grouped,
            self.prefix_keys[layer_idx],
            self.prefix_values[layer_idx],
            self.prefix_mask,
            scale,
            exact,
        )
        out_p = out_p.reshape(slots, kv_heads, per_slot, group, dim).transpose(1, 2)
        out_p = out_p.reshape(slots * per_slot, kv_heads, group, dim)
        lse_p = lse_p.reshape(slots, kv_heads, per_slot, group).transpose(1, 2)
        lse_p = lse_p.reshape(slots * per_slot, kv_heads, group)
        if self._scatter is not None:
            out_p, lse_p = (
                out_p.index_select(0, self._scatter),
                lse_p.index_select(0, self._scatter),
            )

        out = merge_states(out_p, lse_p, out_r, lse_r)
        return out.to(query.dtype).reshape(rows, 1, heads, dim)
