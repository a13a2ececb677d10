"""Grammar compilation and batched token masks with llguidance.

The task grammars are Outlines CFGs (Lark syntax); Outlines' default CFG backend compiles them
with llguidance, and so do we, directly: one `LLMatcher` per generated row, forked with
`deep_copy()` (cheap: the compiled grammar is shared) from a template compiled once.

The end-of-sequence token of the llguidance tokenizer is the chat model's end-of-turn token, so
the mask allows it exactly where the grammar accepts.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch

from grammarrl.errors import GrammarRLError

log = logging.getLogger(__name__)


class GrammarError(GrammarRLError):
    """A grammar does not compile (the message is llguidance's)."""


_LLTOKENIZERS: dict[tuple[int, int], tuple[Any, llguidance.LLTokenizer]] = {}
_LOCK = threading.Lock()


def ll_tokenizer(tokenizer: Any, stop_token_id: int) -> llguidance.LLTokenizer:
    """The llguidance tokenizer for a HF fast tokenizer, with `stop_token_id` as its EOS (cached)."""
    key = (id(tokenizer), int(stop_token_id))
    with _LOCK:
        hit = _LLTOKENIZERS.get(key)
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
        try:
            built = llguidance.hf.from_tokenizer(tokenizer, eos_token=int(stop_token_id))
        except ValueError as err:
            raise GrammarError(f"llguidance cannot wrap this tokenizer: {err}") from err
        _LLTOKENIZERS[key] = (tokenizer, built)  # keeps the tokenizer alive: ids stay unique
        return built


def lark_source(grammar: Any) -> str:
    """A Lark string from a str or an Outlines `CFG` object (its `definition`)."""
    if isinstance(grammar, str):
        return grammar
    definition = getattr(grammar, "definition", None)
    if isinstance(definition, str):
        return definition
    raise TypeError(f"expected a Lark grammar string or an outlines CFG, got {type(grammar)!r}")


class CompiledGrammar:
    """A Lark grammar compiled once for one tokenizer; hands out fresh matchers."""

    def __init__(self, tokenizer: Any, grammar: Any, stop_token_id: int):
        self.tokenizer = tokenizer
        self.stop_token_id = int(stop_token_id)
        self.ll_tokenizer = ll_tokenizer(tokenizer, self.stop_token_id)
        self.source = lark_source(grammar)
        spec = llguidance.LLMatcher.grammar_from_lark(self.source)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            spec, self.ll_tokenizer
        )
        if is_error:
            raise GrammarError(f"the grammar does not compile: {messages[0] if messages else '?'}")
        for message in messages:
            log.warning("grammar warning: %s", message)
        self._template = llguidance.LLMatcher(self.ll_tokenizer, spec, log_level=0)
        if self._template.is_error():
            raise GrammarError(f"the grammar does not compile: {self._template.get_error()}")
        self.vocab_size = self.ll_tokenizer.vocab_size

    def matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the grammar."""
        return self._template.deep_copy()

    def decode(self, token_ids: list[int]) -> str:
        """The text of grammar tokens, byte-exact as the matcher sees it."""
        return self.ll_tokenizer.decode_str(list(token_ids))

    def accepts(self, token_ids: list[int]) -> bool:
        """Independent check: a fresh matcher consumes all tokens and ends in an accepting state
        (a trailing stop token is allowed)."""
        tokens = list(token_ids)
        if tokens and tokens[-1] == self.stop_token_id:
            tokens = tokens[:-1]
        matcher = self.matcher()
        return bool(matcher.consume_tokens(tokens)) and matcher.is_accepting()


def grammar_complete(matcher: llguidance.LLMatcher) -> bool:
    """The output so far is complete: the grammar accepts it and allows nothing but the end
    token after it. Such an output is never cut by the token cap (its end token is forced)."""
    return matcher.is_stopped() and matcher.is_accepting()


class MaskComputer:
    """Batched token masks: llguidance fills a CPU bitmask for all rows in parallel; the bits are
    unpacked on the logits' device into a boolean [rows, logits_width] tensor. Columns past the
    tokenizer's vocabulary (padded embedding rows) are always disallowed."""

    def __init__(self, grammar: CompiledGrammar, logits_width: int, device: torch.device):
        self.grammar = grammar
        self.width = int(logits_width)
        self.device = device
        self.executor = _executor()
        self._bitmask = llguidance.torch.allocate_token_bitmask(8, grammar.vocab_size)
        # byte value -> its 8 bits (little-endian bit order, as llguidance packs tokens)
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        self._byte_bits = bits.bool().to(device)

    def allowed(self, matchers: list[llguidance.LLMatcher]) -> torch.Tensor:
        rows = len(matchers)
        if self._bitmask.shape[0] < rows:
            self._bitmask = llguidance.torch.allocate_token_bitmask(
                max(rows, 2 * self._bitmask.shape[0]), self.grammar.vocab_size
            )
        bitmask = self._bitmask[:rows]
        llguidance.torch.fill_next_token_bitmask_par(
            self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask
        )
        data = bitmask.view(torch.uint8).to(self.device, non_blocking=True)
        allowed = self._byte_bits[data.int()].view(rows, -1)
        have = allowed.shape[1]
        if have >= self.width:
            return allowed[:, : self.width]
        pad = torch.zeros(rows, self.width - have, dtype=torch.bool, device=self.device)
        return torch.cat([allowed, pad], dim=1)


_EXECUTOR: llguidance.LLExecutor | None = None


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = llguidance.LLExecutor()
        return _EXECUTOR
