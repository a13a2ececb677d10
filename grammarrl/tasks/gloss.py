"""English -> ASL gloss (ASLG-PC12). Output: gloss terms separated by single spaces.

Gloss terms use the paper's suffix form (`DESC-X -> X-DESC`, `X-Y -> Y-X`) after three corpus
typo fixes. The closed vocabulary is every term of every gloss line of the corpus.
Metric: corpus BLEU (0-1). Files: aslg_pc12/ENG-ASL_{Train,Dev,test}_0.046.{en,asl} (line i of
.en pairs with line i of .asl), or the hub's achrafothman/aslg_pc12 (one pool, split here).

Search potential (paper table "task-specific potentials"), on the completed terms of a prefix
(those followed by a space) and on the complete output: precision (-0.5 per term whose lemma
matches no source word and is not a closed-class function term, at most 5), coverage (complete
output only: -0.5 per source content word matched by no term, at most 5), degenerate run (-1.0
per maximal run of >= 3 identical adjacent terms). Its word tables are in gloss_words.json.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from functools import cached_property
from pathlib import Path

from grammarrl.data.hub import load_hub_dataset
from grammarrl.data.sources import Row, read_lines
from grammarrl.errors import DataError
from grammarrl.tasks.common import CorpusTask, clean_text
from grammarrl.tasks.grammar_check import alternation
from grammarrl.tasks.metrics import corpus_bleu, validity_rate
from grammarrl.types import Example, Scores

TYPO_FIXES = {"DESC-N": "DESC-THAN", "DESC-RE": "DESC-THERE", "DESC-REFORE": "DESC-THEREFORE"}
PREFIXES = ("DESC-", "X-")
FILES = {"train": "ENG-ASL_Train_0.046", "dev": "ENG-ASL_Dev_0.046", "test": "ENG-ASL_test_0.046"}
HUB_ID = "achrafothman/aslg_pc12"
HUB_DEV, HUB_TEST = 2045, 2046  # the sizes of the corpus' own dev and test files
PRECISION, COVERAGE, RUN = -0.5, -0.5, -1.0
MAX_COUNT = 5
WORDS = json.loads((Path(__file__).with_name("gloss_words.json")).read_text(encoding="utf-8"))
FUNCTION_TERMS = frozenset(WORDS["function_terms"])
STOP_WORDS = FUNCTION_TERMS | frozenset(WORDS["stop_words"])
IRREGULAR: dict[str, str] = WORDS["irregular"]
SUFFIXES: tuple[str, ...] = tuple(WORDS["suffixes"])
# Analysis (paper Table "trap tokens in Gloss predictions"; experiments/aggregate.py): fragments
# the grammar forces after a likely prefix, and the generic gloss X.
TRAP_TERMS = ("THEREFORE-DESC", "OFTEN-DESC", "THERE-DESC")
BARE_X = "X"


# ----- reading --------------------------------------------------------------------------
def read_aslg(directory: Path) -> list[Row]:
    """English/gloss pairs from the corpus' own train/dev/test split files."""
    rows = []
    for split, stem in FILES.items():
        en_path, asl_path = directory / f"{stem}.en", directory / f"{stem}.asl"
        english, gloss = read_lines(en_path), read_lines(asl_path)
        if len(english) != len(gloss):
            raise DataError(
                f"{en_path} has {len(english)} lines but {asl_path} has {len(gloss)}: "
                "line i of the .en file must pair with line i of the .asl file"
            )
        for number, (text, glossed) in enumerate(zip(english, gloss), start=1):
            rows.append(Row(split, {"text": text, "gloss": glossed}, f"{en_path}:{number}"))
    return rows


def read_hub_aslg(seed: int) -> list[Row]:
    """The hub's ASLG-PC12, one unsplit pool, split with `seed` into the corpus' split sizes."""
    pool = load_hub_dataset(HUB_ID, split="train")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    split_of = {i: "test" for i in order[:HUB_TEST]}
    split_of.update({i: "dev" for i in order[HUB_TEST : HUB_TEST + HUB_DEV]})
    return [
        Row(
            split_of.get(i, "train"),
            {"text": r["text"], "gloss": r["gloss"]},
            f"{HUB_ID}:train:{i}",
        )
        for i, r in enumerate(pool)
    ]


# ----- outputs --------------------------------------------------------------------------


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


# ----- search potential -----------------------------------------------------------------
def stem(word: str) -> str:
    """A dictionary-then-suffix-stripping lemma key (lower case), kept >= 3 letters."""
    word = word.lower()
    if word in IRREGULAR:
        return IRREGULAR[word]
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiou":
        word = word[:-1]  # doubled consonant: "planned" -> "plann" -> "plan"
    return word[:-1] if len(word) >= 4 and word.endswith("e") else word


def _matches(a: str, b: str) -> bool:
    """Two stems match when equal or when they share a prefix of at least 4 letters that
    leaves at most 2 letters of the shorter one (corpus lemmas: MALAYSIUM ~ malaysia)."""
    if a == b:
        return True
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return common >= max(4, min(len(a), len(b)) - 2)


def gloss_lemma(term: str) -> list[str]:
    """The lemma parts of a gloss term in suffix form (`CLOSE-DESC` -> [close], `POSS-X` ->
    [poss]), lower case; hyphenated compounds split."""
    for marker in ("-DESC", "-X"):
        if term.endswith(marker) and len(term) > len(marker):
            term = term[: -len(marker)]
            break
    return [part for part in term.lower().split("-") if part]


def _source_words(sentence: str) -> list[str]:
    return re.findall(r"[^\W_]+(?:'[a-z]+)?|\S", sentence.lower())


def gloss_penalty(sentence: str, terms: list[str], complete: bool) -> float:
    """Precision (completed terms), degenerate runs and, on complete outputs, coverage."""
    words = _source_words(sentence)
    stems = {stem(w) for w in words} | set(words)
    total = 0.0
    ungrounded = 0
    lowered = sentence.lower()
    for term in terms:
        parts = gloss_lemma(term)
        grounded = (
            not any(ch.isalnum() for ch in term)  # punctuation
            or "-".join(parts) in lowered  # verbatim (numbers, abbreviations, names)
            or all(p in FUNCTION_TERMS or any(_matches(stem(p), s) for s in stems) for p in parts)
        )
        ungrounded += not grounded
    total += PRECISION * min(ungrounded, MAX_COUNT)
    run = 1
    for prev, term in itertools.pairwise(terms):
        run = run + 1 if term == prev else 1
        if run == 3:  # count each maximal run of >= 3 once, when it reaches 3
            total += RUN
    if complete:
        lemmas = {stem(p) for term in terms for p in gloss_lemma(term)}
        missing = 0
        for w in dict.fromkeys(words):
            if w.isalpha() and len(w) >= 3 and w not in STOP_WORDS:
                key = stem(w)
                if not any(_matches(key, lemma) for lemma in lemmas):
                    missing += 1
        total += COVERAGE * min(missing, MAX_COUNT)
    return total


def gloss_terms_of(text: str, complete: bool) -> list[str]:
    """Completed terms: on a prefix, those followed by the separator (the last one may grow)."""
    terms = text.split(" ")
    if not complete:
        terms = terms[:-1]
    return [t for t in terms if t]


# ----- the task -------------------------------------------------------------------------
class GlossTask(CorpusTask):
    name = "gloss"
    metric_name = "bleu"
    table_label = "Gloss (BLEU)"
    data_dir = "aslg_pc12"
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
        return read_aslg(directory)

    def read_hub(self) -> list[Row]:
        return read_hub_aslg(self.seed)

    def normalise(self, row: Row) -> Example | None:
        text, gloss = row.fields.get("text"), row.fields.get("gloss")
        if not isinstance(text, str) or not isinstance(gloss, str):
            self.skips.skip("missing_field", row.where, "needs text and gloss")
            return None
        text, terms = clean_text(text), gloss_terms(gloss)
        if not text or not terms:
            self.skips.skip("empty_text", row.where)
            return None
        return Example(uid=self.example_uid(row), input=text, target=" ".join(terms))

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

    def search_penalty(self, example: Example, text: str, complete: bool) -> float:
        return gloss_penalty(example.input, gloss_terms_of(text, complete), complete)
