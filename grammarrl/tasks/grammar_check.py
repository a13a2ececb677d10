"""Lark grammar building blocks and an llguidance acceptance check (shared with decoding).

Large word lists go into TERMINALS (uppercase rules): llguidance refuses a lowercase rule with
more than 2,000 alternatives. Separators that precede a word are kept inside the terminal
(`" " WORD`) so the byte-level BPE tokens that carry a leading space ("Ġword") stay natural.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def lark_literal(text: str) -> str:
    """A Lark string literal that matches `text` exactly (JSON escapes are Lark escapes)."""
    return json.dumps(text, ensure_ascii=False)


def alternation(texts: Iterable[str]) -> str:
    """`"a" | "b" | ...` over distinct texts (sorted, so the grammar text is deterministic)."""
    items = sorted(set(texts))
    if not items:
        raise ValueError("an alternation needs at least one string")
    return " | ".join(lark_literal(text) for text in items)


def json_string(text: str) -> str:
    """The JSON encoding of a string value, as it appears in the canonical outputs."""
    return json.dumps(text, ensure_ascii=False)


def compile_grammar(lark: str, tokenizer: Any) -> tuple[Any, str]:
    """(llguidance tokenizer, grammar spec) for a Lark grammar and a fast HF tokenizer.

    The llguidance tokenizer is decoding's (`grammarrl.decoding.grammar.ll_tokenizer`, cached
    per HF tokenizer, end-of-turn token as EOS), so the check sees the tokens decoding sees.
    `llguidance.LLMatcher(ll_tokenizer, spec)` then gives a matcher; check `is_error()`.
    """
    import llguidance

    from grammarrl.decoding.grammar import ll_tokenizer
    from grammarrl.models.chat import end_of_turn_id

    return ll_tokenizer(tokenizer, end_of_turn_id(tokenizer)), llguidance.grammar_from("lark", lark)


class GrammarChecker:
    """Tells whether strings are accepted, whole, by a grammar under a tokenizer."""

    def __init__(self, lark: str, tokenizer: Any) -> None:
        import llguidance

        self.tokenizer = tokenizer
        ll_tokenizer, spec = compile_grammar(lark, tokenizer)
        self._start = llguidance.LLMatcher(ll_tokenizer, spec, log_level=0)
        if self._start.is_error():
            raise ValueError(f"the grammar does not compile: {self._start.get_error()[:500]}")

    def accepts(self, text: str) -> bool:
        """True if the natural tokenization of `text` is a complete sentence of the grammar."""
        matcher = self._start.deep_copy()  # a matcher that hit an error never leaves it
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return bool(matcher.consume_tokens(ids)) and matcher.is_accepting()

    def rejected(self, texts: Iterable[str]) -> list[str]:
        """The distinct texts that are not accepted."""
        return [text for text in dict.fromkeys(texts) if not self.accepts(text)]
