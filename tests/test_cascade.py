"""Cascade decoding (the prompt KV kept once per prompt, `grammarrl/decoding/cascade.py`) against
the copied-rows layout and brute force, on the `tiny` model and a grouped-query variant of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.decoding.cascade import (
    SharedPromptCache,
    attention_with_lse,
    merge_states,
    supports_cascade,
)
from grammarrl.decoding.smc import smc
from tests.support.decoding import (
    JSON_GRAMMAR,
    WORDS_GRAMMAR,
    Sharpened,
    brute_greedy,
    teacher_forced,
)


@pytest.fixture(scope="module")
def gqa_model(tok):
    """A tiny Llama with grouped-query attention (4 query heads over 2 key/value heads), as
    SmolLM2 (9 over 3)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return LlamaForCausalLM(config).eval()


def reference_attention(q, keys, values, scale):
    """Plain softmax attention of one query [heads, dim] over keys / values [kv_heads, n, dim]
    (each query head reads key/value head h // group)."""
    group = q.shape[0] // keys.shape[0]
    k = keys.repeat_interleave(group, 0).double()
    v = values.repeat_interleave(group, 0).double()
    weights = torch.softmax((k @ q.double().unsqueeze(-1)).squeeze(-1) * scale, -1)
    return (weights.unsqueeze(-1) * v).sum(1)


def ids(gens):
    return [g.token_ids for g in gens]


# --------------------------------------------------------------------------- the attention


@pytest.mark.parametrize("exact_fp32", [False, True])
def test_cascade_attention_equals_attention_over_the_concatenated_kv(exact_fp32, monkeypatch):
    """Rows of three prompts of different lengths, in mixed order, with forks and drops and a
    capacity small enough to grow: every row's output equals attention over its own prompt's
    KV followed by its own generated KV (float64 reference), on both attention back ends."""
    monkeypatch.setattr(SharedPromptCache, "exact_fp32", exact_fp32)
    gen = torch.Generator().manual_seed(0)
    kv_heads, group, dim, layers = 2, 3, 16, 2
    lengths = [7, 12, 5]
    prompt_kv = [
        [
            (
                torch.randn(1, kv_heads, n, dim, generator=gen),
                torch.randn(1, kv_heads, n, dim, generator=gen),
            )
            for _ in range(layers)
        ]
        for n in lengths
    ]
    cache = SharedPromptCache(prompt_kv, capacity=2)
    row_prompts = [2, 0, 1, 0, 2, 1]
    cache.select(row_prompts)
    history: list[list[list[tuple[torch.Tensor, torch.Tensor]]]] = [
        [[] for _ in range(layers)] for _ in row_prompts
    ]  # per row, per layer: (k, v) per step
    scale = dim**-0.5
    steps = [None, [1, 1, 0, 3, 4, 2], None, [0, 2, 4], [2, 2, 0, 1], None]
    for step, sources in enumerate(steps):
        if sources is not None:
            row_prompts = [row_prompts[s] for s in sources]
            history = [[list(layer) for layer in history[s]] for s in sources]
            cache.select(row_prompts, sources)
        rows = len(row_prompts)
        for layer in range(layers):
            k = torch.randn(rows, kv_heads, 1, dim, generator=gen)
            v = torch.randn(rows, kv_heads, 1, dim, generator=gen)
            q = torch.randn(rows, kv_heads * group, 1, dim, generator=gen)
            for r in range(rows):
                history[r][layer].append((k[r, :, 0], v[r, :, 0]))
            row_keys, row_values = cache.update(k, v, layer)
            assert row_keys.shape == (rows, kv_heads, step + 1, dim)
            out = cache.attend(layer, q, row_keys, row_values, scale)
            assert out.shape == (rows, 1, kv_heads * group, dim)
            for r, p in enumerate(row_prompts):
                pk, pv = prompt_kv[p][layer]
                keys = torch.cat([pk[0], torch.stack([h[0] for h in history[r][layer]], 1)], 1)
                values = torch.cat([pv[0], torch.stack([h[1] for h in history[r][layer]], 1)], 1)
                expected = reference_attention(q[r, :, 0], keys, values, scale)
                np.testing.assert_allclose(out[r, 0].double(), expected, atol=1e-5)
    assert len(cache.prefix_keys[0]) == 2  # prompt 1 has no rows left: it left the prompt level


def test_merge_states_is_attention_over_the_union():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, 8, generator=gen)
    k = torch.randn(2, 3, 10, 8, generator=gen)
    v = torch.randn(2, 3, 10, 8, generator=gen)
    full, lse = attention_with_lse(q, k, v, None, 0.3, exact_fp32=True)
    for split in (1, 6, 9):
        a, la = attention_with_lse(q, k[:, :, :split], v[:, :, :split], None, 0.3)
        b, lb = attention_with_lse(q, k[:, :, split:], v[:, :, split:], None, 0.3)
        torch.testing.assert_close(merge_states(a, la, b, lb), full, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.logaddexp(la, lb), lse, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the decoder


def modes(prompts):
    """(name, call) of every decoding mode, several prompts at once."""
    return [
        ("greedy", lambda d: d.greedy(prompts)),
        (
            "beam",
            lambda d: [
                g for r in d.beam(prompts, 3, length_penalty=1.0) for g in r.finished + [r.top]
            ],
        ),
        (
            "sample",
            lambda d: [
                g
                for grp in d.sample(
                    prompts, 4, temperature=0.7, generator=torch.Generator().manual_seed(3)
                )
                for g in grp
            ],
        ),
        (
            "rollout",
            lambda d: [
                g
                for grp in d.rollout(
                    prompts, 3, 3, generator=torch.Generator().manual_seed(4), length_penalty=1.0
                )
                for g in grp
            ],
        ),
        (
            "smc",
            lambda d: [
                g
                for ps in smc(
                    d,
                    prompts,
                    6,
                    generator=torch.Generator().manual_seed(5),
                    resample_generator=torch.Generator().manual_seed(6),
                )
                for g in ps.generations
            ],
        ),
    ]


@pytest.mark.parametrize("which", ["tiny", "gqa"])
def test_cascade_decoding_equals_copied_rows(which, model, gqa_model, tok, prompts):
    """Every mode gives the same tokens and (within float tolerance) the same log-probs with the
    prompt KV kept once (cascade) as with one copy per row, on several prompts of different
    lengths, with multi-head and grouped-query attention."""
    net = Sharpened(model if which == "tiny" else gqa_model, scale=4.0)  # less flat than random
    assert supports_cascade(net)
    for grammar, max_new in ((JSON_GRAMMAR, 20), (WORDS_GRAMMAR, 12)):
        shared = ConstrainedDecoder(net, tok, grammar, max_new_tokens=max_new)
        copied = ConstrainedDecoder(net, tok, grammar, max_new_tokens=max_new, cascade=False)
        for name, run in modes(prompts):
            a, b = run(shared), run(copied)
            assert ids(a) == ids(b), (which, name)
            for x, y in zip(a, b):
                np.testing.assert_allclose(x.logp_unconstrained, y.logp_unconstrained, atol=1e-4)
                np.testing.assert_allclose(x.log_allowed_mass, y.log_allowed_mass, atol=1e-4)


def test_cascade_runs_the_decode_steps_and_restores_attention(model, tok, prompts, monkeypatch):
    """Decode steps go through cascade attention (one call per layer and step), the prompt level
    holds the prefill's tensors themselves (no copy for one prompt), and the model's attention
    implementation is restored after every call, also when decoding fails."""
    calls, caches = [], []
    real_attend, real_select = SharedPromptCache.attend, SharedPromptCache.select

    def attend(self, *args, **kwargs):
        calls.append(args[0])
        return real_attend(self, *args, **kwargs)

    def select(self, *args, **kwargs):
        caches.append(self)
        return real_select(self, *args, **kwargs)

    monkeypatch.setattr(SharedPromptCache, "attend", attend)
    monkeypatch.setattr(SharedPromptCache, "select", select)
    before = model.config._attn_implementation
    dec = ConstrainedDecoder(model, tok, JSON_GRAMMAR, max_new_tokens=20)
    start = dec.forward_calls
    gens = dec.rollout(
        prompts[:1], 2, 2, generator=torch.Generator().manual_seed(0), length_penalty=1.0
    )[0]
    steps = dec.forward_calls - start - 1  # minus the prefill
    assert steps > 5 and len(calls) == steps * model.config.num_hidden_layers
    assert model.config._attn_implementation == before
    assert caches[0].prefix_keys[0].shape[0] == 1
    for g in gens:  # and the records are right (brute force teacher forcing)
        lu, _, _ = teacher_forced(model, tok, JSON_GRAMMAR, prompts[0], g.token_ids)
        np.testing.assert_allclose(g.logp_unconstrained, lu, atol=2e-4)

    def boom(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(SharedPromptCache, "attend", boom)
    with pytest.raises(RuntimeError, match="boom"):
        dec.greedy(prompts[:1])
    assert model.config._attn_implementation == before
    with torch.inference_mode():  # the plain model still runs its own attention
        model(input_ids=torch.tensor([prompts[0]]))


def test_gqa_greedy_equals_brute_force(gqa_model, tok, prompts):
    dec = ConstrainedDecoder(gqa_model, tok, JSON_GRAMMAR, max_new_tokens=20)
    for prompt, gen in zip(prompts, dec.greedy(prompts)):
        tokens, lu, lc, _ = brute_greedy(gqa_model, tok, JSON_GRAMMAR, prompt, 20)
        assert gen.token_ids == tokens
        np.testing.assert_allclose(gen.logp_unconstrained, lu, atol=2e-4)
        np.testing.assert_allclose(gen.logp_constrained, lc, atol=2e-4)


def test_row_buffers_grow_past_their_first_capacity(model, tok, prompts, monkeypatch):
    """Rows that outgrow the first allocation of their generated KV keep exact records."""
    real_init = SharedPromptCache.__init__
    monkeypatch.setattr(
        SharedPromptCache, "__init__", lambda self, kv, capacity=32: real_init(self, kv, capacity=3)
    )
    dec = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=14)
    copied = ConstrainedDecoder(model, tok, WORDS_GRAMMAR, max_new_tokens=14, cascade=False)
    a = dec.rollout(prompts, 2, 2, generator=torch.Generator().manual_seed(2), length_penalty=1.0)
    b = copied.rollout(
        prompts, 2, 2, generator=torch.Generator().manual_seed(2), length_penalty=1.0
    )
    assert [ids(g) for g in a] == [ids(g) for g in b]
    assert max(len(g.token_ids) for grp in a for g in grp) > 6


def test_unsupported_attention_falls_back_to_copied_rows(tok, prompts):
    """A sliding-window model is refused by cascade attention: the decoder copies the prompt KV
    per row instead (same outputs as asking for that layout), and cascade=True says why."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        sliding_window=8,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        mistral = MistralForCausalLM(config).eval()
    assert not supports_cascade(mistral)
    auto = ConstrainedDecoder(mistral, tok, JSON_GRAMMAR, max_new_tokens=10)
    copied = ConstrainedDecoder(mistral, tok, JSON_GRAMMAR, max_new_tokens=10, cascade=False)
    gen = lambda: torch.Generator().manual_seed(0)
    assert [ids(g) for g in auto.rollout(prompts, 2, 2, generator=gen(), length_penalty=1.0)] == [
        ids(g) for g in copied.rollout(prompts, 2, 2, generator=gen(), length_penalty=1.0)
    ]
    with pytest.raises(ValueError, match="cascade"):
        ConstrainedDecoder(mistral, tok, JSON_GRAMMAR, max_new_tokens=10, cascade=True).greedy(
            prompts[:1]
        )
