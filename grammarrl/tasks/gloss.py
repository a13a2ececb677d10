"""English -> ASL gloss (ASLG-PC12). Output: gloss terms separated by single spaces.

Gloss terms use the paper's suffix form (`DESC-X -> X-DESC`, `X-Y -> Y-X`) after three corpus
typo fixes. The closed vocabulary is every term of every gloss line of the corpus.
Metric: corpus BLEU (0-1).
"""

from __future__ import annotations

import random
from functools import cached_property
from pathlib import Path

from grammarrl.data.local import read_aslg
from grammarrl.data.sources import Row
from grammarrl.metrics import corpus_bleu, validity_rate
from grammarrl.tasks.base import Example, Scores
from grammarrl.tasks.common import CorpusTask, clean_text
from grammarrl.tasks.grammar_check import alternation

TYPO_FIXES = {"DESC-N": "DESC-THAN", "DESC-RE": "DESC-THERE", "DESC-REFORE": "DESC-THEREFORE"}
PREFIXES = ("DESC-", "X-")


def suffix_form(term: str) -> str:
    """`DESC-X -> X-DESC`, `X-Y -> Y-X` (after the typo fixes); other terms unchanged."""
    term = TYPO_FIXES.get(term, term)
    for prefix in PREFIXES:
        if term.startswith(prefix) and len(term) > len(prefix):
            return f"{term[len(prefix) :]}-{prefix[:-1]}"
    return term


def gloss_terms(gloss: str) -> list[str]:
    """A corpus gloss line as terms in suffix form (any whitespace separates terms)."""
    return [suffix_form(term) for term in gloss.split()]


class GlossTask(CorpusTask):
    name = "gloss"
    metric_name = "bleu"
    instruction = (
        "Simplify the sentence into basic components. Separate components with a single space; "
        "preserve the meaning and structure of the original."
    )
    output_format = (
        "Output format: TERM TERM TERM ... (upper-case gloss terms separated by single spaces; "
        "output only the gloss)."
    )
    inverse_instruction = (
        "Given the glossed form, reconstruct the original English sentence as it was actually "
        "written. Output only that sentence."
    )

    def read_local(self, directory: Path) -> list[Row]:
        return read_aslg(directory, self.skips)

    def normalise(self, row: Row) -> Example | None:
        text, gloss = row.fields.get("text"), row.fields.get("gloss")
        if not isinstance(text, str) or not isinstance(gloss, str):
            self.skips.skip("missing_field", row.where, "needs text and gloss")
            return None
        text, terms = clean_text(text), gloss_terms(gloss)
        if not text or not terms:
            self.skips.skip("empty_text", row.where)
            return None
        return Example(uid=row.where, input=text, target=" ".join(terms))

    @cached_property
    def vocabulary(self) -> list[str]:
        """All gloss terms of the corpus (every split), sorted."""
        return sorted(
            {t for pool in self.corpus.values() for ex in pool for t in ex.target.split(" ")}
        )

    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def pick_fewshot(self, pool: list[Example], k: int) -> list[Example]:
        """k varied sentences of 6-25 words whose gloss differs from the upper-cased input,
        no two sharing half their words, in a seeded order."""

        def useful(ex: Example) -> bool:
            words = ex.input.split()
            return (
                6 <= len(words) <= 25
                and ex.input.isascii()
                and ex.target.split(" ") != ex.input.upper().split()
            )

        candidates = [ex for ex in pool if useful(ex)]
        random.Random(self.seed).shuffle(candidates)
        chosen: list[Example] = []
        chosen_words: list[set[str]] = []
        for ex in candidates:
            words = set(ex.input.lower().split())
            if all(
                len(words & other) < 0.5 * min(len(words), len(other)) for other in chosen_words
            ):
                chosen.append(ex)
                chosen_words.append(words)
                if len(chosen) == k:
                    break
        return chosen

    # ----- hints and prompt -------------------------------------------------------------
    def hint_vocabularies(self) -> dict[str, list[str]]:
        return {"gloss": self.vocabulary}

    def hint_display(self, item: str) -> str:
        for prefix in PREFIXES:
            item = item.removesuffix("-" + prefix[:-1])
        return item.lower()

    def context(self, example: Example) -> str:
        hints = self.hints(example).get("gloss")
        return f"Similar gloss terms: {' '.join(hints)}" if hints else ""

    # ----- grammar, parsing, scoring ----------------------------------------------------
    @cached_property
    def _grammar(self) -> str:
        # The word list is one TERMINAL; the separating space lives inside SPACED_TERM.
        return (
            "start: TERM SPACED_TERM*\n"
            f"TERM: {alternation(self.vocabulary)}\n"
            'SPACED_TERM: " " TERM\n'
        )

    def grammar(self) -> str:
        return self._grammar

    @cached_property
    def _vocabulary_set(self) -> frozenset[str]:
        return frozenset(self.vocabulary)

    def parse(self, output: str) -> list[str]:
        terms = output.split(" ")
        unknown = [t for t in terms if t not in self._vocabulary_set]
        if unknown:
            raise ValueError(f"not gloss terms of the vocabulary: {unknown[:5]}")
        return terms

    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        valid = [self.try_parse(p) is not None for p in predictions]
        hypotheses = [p if ok else "" for p, ok in zip(predictions, valid)]
        bleu = corpus_bleu(hypotheses, [ex.target for ex in examples])
        return Scores(
            metric=self.metric_name,
            value=bleu,
            per_example=[{"uid": ex.uid, "valid": ok} for ex, ok in zip(examples, valid)],
            details={"bleu": bleu},
            validity=validity_rate(valid),
        )
