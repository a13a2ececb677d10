"""Decoding test helpers: small grammars, a sharpened tiny model, brute-force references,
validity checks."""

from __future__ import annotations

import re
from types import SimpleNamespace

import llguidance
import numpy as np
import torch

from grammarrl.decoding import Generation
from grammarrl.decoding.grammar import ll_tokenizer
from grammarrl.models.chat import end_of_turn_id
from grammarrl.models.loading import kv_cache_name, output_kv_cache
from grammarrl.tasks.grammar_check import GrammarChecker

COLORS = ["red", "green", "blue", "dark red"]


# A JSON object with an enum value and a short number.
JSON_GRAMMAR = r"""
start: "{\"color\": \"" COLOR "\", \"n\": " NUM "}"
COLOR: "red" | "green" | "blue" | "dark red"
NUM: /[0-9]{1,3}/
"""


# A word list whose separators live inside the literals (byte-level BPE: "Ġword").
WORDS_GRAMMAR = r"""
start: FIRST REST*
FIRST: "cat" | "dog" | "bird" | "horse"
REST: " cat" | " dog" | " bird" | " horse"
"""


# A small finite language (every tokenization path can be enumerated).
FINITE_GRAMMAR = r"""
start: "cat" | "dog" | "bird"
"""


JSON_RE = re.compile(r'\{"color": "(red|green|blue|dark red)", "n": [0-9]{1,3}\}')


MESSAGES = ["hi", "What colour is the sky on a clear day, and why?", "x y z"]


class Sharpened(torch.nn.Module):
    """The tiny model with logits scaled up: its random logits are nearly uniform otherwise."""

    def __init__(self, inner: torch.nn.Module, scale: float):
        super().__init__()
        self.inner = inner
        self.scale = scale

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        return SimpleNamespace(
            logits=out.logits * self.scale, **{kv_cache_name(): output_kv_cache(out)}
        )


class WideLogits(torch.nn.Module):
    """Extra logits columns beyond the tokenizer's vocabulary, made very attractive."""

    def __init__(self, inner: torch.nn.Module, extra: int = 40):
        super().__init__()
        self.inner = inner
        self.extra = extra

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        logits = out.logits
        pad = torch.full((*logits.shape[:-1], self.extra), 5.0, dtype=logits.dtype)
        return SimpleNamespace(
            logits=torch.cat([logits, pad], -1), **{kv_cache_name(): output_kv_cache(out)}
        )


def fresh_matcher(tok, grammar: str) -> llguidance.LLMatcher:
    """A matcher built straight from llguidance (not through the decoder's CompiledGrammar)."""
    lt = ll_tokenizer(tok, end_of_turn_id(tok))
    return llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_lark(grammar))


def allowed_mask(matcher, width: int) -> torch.Tensor:
    raw = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    bits = np.unpackbits(raw, bitorder="little").astype(bool)
    mask = torch.zeros(width, dtype=torch.bool)
    n = min(width, bits.size)
    mask[:n] = torch.from_numpy(bits[:n])
    return mask


@torch.inference_mode()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Next-token logits after `ids`, one forward without any cache."""
    return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def step_records(logits: torch.Tensor, allowed: torch.Tensor):
    lse_all = torch.logsumexp(logits, -1)
    masked = logits.masked_fill(~allowed, float("-inf"))
    lse_allowed = torch.logsumexp(masked, -1)
    return masked, lse_all, lse_allowed


def brute_greedy(model, tok, grammar, prompt, max_new):
    stop = end_of_turn_id(tok)
    matcher = fresh_matcher(tok, grammar)
    tokens, lu, lc, lm = [], [], [], []
    for _ in range(max_new):
        logits = full_logits(model, prompt + tokens)
        masked, lse_all, lse_allowed = step_records(logits, allowed_mask(matcher, logits.numel()))
        t = int(masked.argmax())
        tokens.append(t)
        lu.append(float(logits[t] - lse_all))
        lc.append(float(logits[t] - lse_allowed))
        lm.append(float(lse_allowed - lse_all))
        if t == stop:
            break
        assert matcher.consume_token(t)
    return tokens, lu, lc, lm


def brute_beam(model, tok, grammar, prompt, width, max_new, length_penalty=0.0):
    """Beam search over pi^G, recomputing everything from scratch at every step; finished
    hypotheses ranked by sum / length**length_penalty (HF's rule)."""
    norm = lambda value, length: value / length**length_penalty
    stop = end_of_turn_id(tok)
    live = [([], 0.0, fresh_matcher(tok, grammar))]
    finished: list[tuple[float, list[int]]] = []
    for step in range(max_new):
        cands = []
        for b, (tokens, score, matcher) in enumerate(live):
            logits = full_logits(model, prompt + tokens)
            masked, _, lse_allowed = step_records(logits, allowed_mask(matcher, logits.numel()))
            logp = masked - lse_allowed
            for t in torch.nonzero(torch.isfinite(logp)).flatten().tolist():
                cands.append((score + float(logp[t]), b, t))
        cands.sort(key=lambda c: -c[0])
        new_live = []
        for rank, (value, b, t) in enumerate(cands[: 2 * width]):
            tokens, _, matcher = live[b]
            if t == stop:
                if rank < width:
                    finished.append((norm(value, len(tokens) + 1), tokens + [t]))
                continue
            m = matcher.deep_copy()
            assert m.consume_token(t)
            new_live.append((tokens + [t], value, m))
            if len(new_live) == width:
                break
        finished.sort(key=lambda f: -f[0])
        best_live = norm(new_live[0][1], len(new_live[0][0])) if new_live else None
        if not new_live or (len(finished) >= width and best_live <= finished[width - 1][0]):
            return finished, []
        live = new_live
        if step + 1 == max_new:
            return finished, live
    return finished, live


def enumerate_paths(model, tok, grammar, prompt, temperature=1.0, max_depth=12):
    """Every token path of a finite language with its probability under softmax(masked/T)."""
    stop = end_of_turn_id(tok)
    out: dict[tuple[int, ...], float] = {}

    def visit(tokens, matcher, logp):
        logits = full_logits(model, prompt + tokens)
        allowed = allowed_mask(matcher, logits.numel())
        dist = torch.log_softmax((logits / temperature).masked_fill(~allowed, float("-inf")), -1)
        for t in torch.nonzero(allowed).flatten().tolist():
            if t == stop:
                out[tuple(tokens + [t])] = logp + float(dist[t])
            else:
                assert len(tokens) < max_depth
                m = matcher.deep_copy()
                assert m.consume_token(t)
                visit(tokens + [t], m, logp + float(dist[t]))

    visit([], fresh_matcher(tok, grammar), 0.0)
    return out


def teacher_forced(model, tok, grammar, prompt, tokens):
    """Per-token (lu, lc, lm) of `tokens` after `prompt` from ONE forward pass, fresh matcher."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    matcher = fresh_matcher(tok, grammar)
    lu, lc, lm = [], [], []
    for i, t in enumerate(tokens):
        _, lse_all, lse_allowed = step_records(logits[i], allowed_mask(matcher, logits.shape[1]))
        lu.append(float(logits[i, t] - lse_all))
        lc.append(float(logits[i, t] - lse_allowed))
        lm.append(float(lse_allowed - lse_all))
        if t != end_of_turn_id(tok):
            assert matcher.consume_token(t)
    return lu, lc, lm


def assert_valid(tok, grammar, gen: Generation, max_new: int):
    """Finished: accepted by a fresh matcher and ends with the stop token; truncated: a valid
    prefix of max_new tokens without the stop token."""
    stop = end_of_turn_id(tok)
    matcher = fresh_matcher(tok, grammar)
    if gen.finished:
        assert gen.token_ids[-1] == stop and stop not in gen.token_ids[:-1]
        assert matcher.consume_tokens(gen.token_ids[:-1]) and matcher.is_accepting()
        assert gen.text == tok.decode(gen.token_ids[:-1])
    else:
        assert gen.truncated and len(gen.token_ids) == max_new and stop not in gen.token_ids
        assert matcher.consume_tokens(gen.token_ids)
    n = len(gen.token_ids)
    assert (
        len(gen.logp_unconstrained) == len(gen.logp_constrained) == len(gen.log_allowed_mass) == n
    )


class EndBias(torch.nn.Module):
    """The random model with a bonus on the end-of-turn logit, so that open-ended outputs (gloss
    term lists) end at random lengths instead of always running to max_new_tokens."""

    def __init__(self, inner: torch.nn.Module, stop: int, bias: float):
        super().__init__()
        self.inner, self.stop, self.bias = inner, stop, bias

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        logits = out.logits.clone()
        logits[..., self.stop] += self.bias
        return SimpleNamespace(logits=logits, **{kv_cache_name(): output_kv_cache(out)})


def check_validity(task, tok, gens, max_new):
    """Finished outputs: parsed by the task, accepted by an independent checker (re-tokenised
    text) and by a fresh matcher on the generated tokens. Truncated: a valid prefix."""
    stop = end_of_turn_id(tok)
    grammar = task.grammar()
    checker = GrammarChecker(grammar, tok)
    spec = llguidance.LLMatcher.grammar_from_lark(grammar)
    lt = ll_tokenizer(tok, stop)
    finished = 0
    for g in gens:
        matcher = llguidance.LLMatcher(lt, spec, log_level=0)
        assert g.error is None
        if g.finished:
            finished += 1
            assert g.token_ids[-1] == stop and stop not in g.token_ids[:-1]
            assert matcher.consume_tokens(g.token_ids[:-1]) and matcher.is_accepting()
            assert checker.accepts(g.text), g.text
            task.parse(g.text)  # raises ValueError if invalid
        else:
            assert g.truncated and len(g.token_ids) == max_new
            assert matcher.consume_tokens(g.token_ids)
    return finished
