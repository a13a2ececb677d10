"""Expensive potentials Phi_exp for the inference-time methods (paper appendix "Baselines").

Every potential returns log Phi <= 0 (or any real for the reverse likelihood):

- `reverse`: the noisy-channel likelihood log pi_ref(x | tau(y)) = SUM over the tokens of x of
  log pi_ref(x_k | tau(y), x_<k), teacher-forced on the reverse prompt with no grammar mask, under
  the frozen reference (adapter disabled), on complete outputs only. The reverse prompt's static
  part is the `ReferenceScorer`'s, computed once. Unit exponent, no scale.
- `task`: the task-specific soft penalties of the paper's Table "task-specific potentials",
  judged on completed units of prefixes (closed CoNLL fields; gloss terms followed by a space)
  and on the complete output:
    CoNLL grounding (-3.0 per value not a verbatim substring of the sentence), word boundary
    (-1.5 per value found only inside longer words), duplicate (-1.0 per extra field repeating a
    non-empty value);
    gloss precision (-0.5 per completed term whose lemma matches no source word and is not a
    closed-class function term, at most 5), coverage (complete output only: -0.5 per source
    content word matched by no term, at most 5), degenerate run (-1.0 per maximal run of >= 3
    identical adjacent terms).
  WoS has none (its grammar already enforces the vocabularies and the hierarchy).
- `none`: Phi = 1 (the target is the grammar posterior p(y | x, G)).

A potential is bound to the examples of one decoding call (`bind`) to serve as the decoder's
`Twist`; values are memoised per (example, text).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import torch

from grammarrl.chat import encode_prompt
from grammarrl.errors import ConfigError
from grammarrl.tasks.base import Example, Task

POTENTIALS = ("reverse", "task", "none")


class Potential:
    """log Phi on prefixes (`prefix`) and on complete outputs (`complete`, batched per example)."""

    name = "none"
    on_prefix = False  # evaluated after every token (SMC twist) or only at completion

    def prefix(self, example: Example, text: str) -> float:
        return 0.0

    def complete(self, example: Example, texts: list[str]) -> list[float]:
        return [0.0] * len(texts)

    # cost accounting (model forward token positions run by the potential)
    forward_tokens = 0
    forward_calls = 0

    def bind(self, examples: list[Example]) -> BoundPotential:
        return BoundPotential(self, examples)


class BoundPotential:
    """A potential over the prompts of one decoding call (prompt index -> example): the
    decoder's `Twist`, memoised per (prompt, text)."""

    def __init__(self, potential: Potential, examples: list[Example]):
        self.potential = potential
        self.examples = examples
        self.on_prefix = potential.on_prefix
        self._prefix: dict[tuple[int, str], float] = {}
        self._complete: dict[tuple[int, str], float] = {}

    def prefix(self, prompt: int, text: str) -> float:
        key = (prompt, text)
        if key not in self._prefix:
            self._prefix[key] = float(self.potential.prefix(self.examples[prompt], text))
        return self._prefix[key]

    def complete(self, prompt: int, texts: list[str]) -> list[float]:
        todo = list(dict.fromkeys(t for t in texts if (prompt, t) not in self._complete))
        if todo:
            values = self.potential.complete(self.examples[prompt], todo)
            for text, value in zip(todo, values):
                self._complete[(prompt, text)] = float(value)
        return [self._complete[(prompt, t)] for t in texts]


# ---------------------------------------------------------------------- reverse likelihood


class ReversePotential(Potential):
    """log pi_ref(x | tau(y)), summed over the tokens of x (the reverse reward's numerator)."""

    name = "reverse"

    def __init__(self, scorer: Any, batch_size: int = 16):
        self.scorer = scorer  # grammarrl.rewards.ReferenceScorer
        self.batch_size = int(batch_size)
        self.forward_tokens = 0
        self.forward_calls = 0

    @torch.no_grad()
    def complete(self, example: Example, texts: list[str]) -> list[float]:
        from grammarrl.models import reference_mode
        from grammarrl.scoring import sequence_logprobs

        if not texts:
            return []
        scorer = self.scorer
        prefix = scorer.reverse_static_prefix()
        x_ids = scorer.input_ids(example)
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            prompts = [
                encode_prompt(scorer.tokenizer, scorer.task.reverse_messages(t)) for t in chunk
            ]
            with reference_mode(scorer.model):
                logps = sequence_logprobs(
                    scorer.model,
                    [p + x_ids for p in prompts],
                    [len(p) for p in prompts],
                    prefix=prefix,
                )
            self.forward_calls += 1
            # positions run: the suffixes after the cached prefix, packed into one row
            self.forward_tokens += sum(len(p) + len(x_ids) - len(prefix.tokens) for p in prompts)
            out.extend(float(lp.sum()) for lp in logps)
        return out


# ---------------------------------------------------------------------- CoNLL

CONLL_FIELD = re.compile(r'"(person|organization|location|misc)": ("(?:[^"\\]|\\.)*")')
GROUNDING, BOUNDARY, DUPLICATE = -3.0, -1.5, -1.0


def conll_fields(text: str) -> dict[str, str]:
    """The closed fields of a (partial) CoNLL output: a value counts once its closing quote is
    emitted (the values are closed-vocabulary JSON strings)."""
    fields = {}
    for match in CONLL_FIELD.finditer(text):
        try:
            fields[match.group(1)] = json.loads(match.group(2))
        except json.JSONDecodeError:
            continue
    return fields


def conll_penalty(sentence: str, fields: dict[str, str]) -> float:
    """Grounding, word-boundary and duplicate penalties of the closed fields."""
    total = 0.0
    seen: dict[str, int] = {}
    for value in fields.values():
        if not value:
            continue
        seen[value] = seen.get(value, 0) + 1
        if value not in sentence:
            total += GROUNDING
        elif not _on_word_boundary(sentence, value):
            total += BOUNDARY
    total += DUPLICATE * sum(count - 1 for count in seen.values())
    return total


def _on_word_boundary(sentence: str, value: str) -> bool:
    """Some occurrence of `value` is not inside a longer word (alphanumerics on either side)."""
    start = sentence.find(value)
    while start >= 0:
        end = start + len(value)
        before = sentence[start - 1] if start > 0 else " "
        after = sentence[end] if end < len(sentence) else " "
        if not (before.isalnum() and value[0].isalnum()) and not (
            after.isalnum() and value[-1].isalnum()
        ):
            return True
        start = sentence.find(value, start + 1)
    return False


class ConllPotential(Potential):
    name = "task"
    on_prefix = True

    def prefix(self, example: Example, text: str) -> float:
        return conll_penalty(example.input, conll_fields(text))

    def complete(self, example: Example, texts: list[str]) -> list[float]:
        return [conll_penalty(example.input, conll_fields(t)) for t in texts]


# ---------------------------------------------------------------------- gloss

PRECISION, COVERAGE, RUN = -0.5, -0.5, -1.0
MAX_COUNT = 5
# Closed-class function terms: never penalised as ungrounded (gloss inserts or keeps them freely).
FUNCTION_TERMS = frozenset(
    [
        "a",
        "an",
        "the",
        "be",
        "have",
        "do",
        "not",
        "no",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "as",
        "and",
        "or",
        "but",
        "if",
        "then",
        "than",
        "that",
        "this",
        "these",
        "those",
        "there",
        "here",
        "it",
        "its",
        "i",
        "me",
        "my",
        "we",
        "us",
        "our",
        "you",
        "your",
        "he",
        "him",
        "his",
        "she",
        "her",
        "they",
        "them",
        "their",
        "who",
        "whom",
        "whose",
        "which",
        "what",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "some",
        "each",
        "every",
        "other",
        "such",
        "so",
        "very",
        "more",
        "most",
        "also",
        "only",
        "just",
        "too",
        "can",
        "could",
        "will",
        "would",
        "shall",
        "should",
        "may",
        "might",
        "must",
        "poss",
        "x",
        "desc",
        "s",
        "'s",
    ]
)
# Stop words: source words whose absence from the gloss is never penalised.
STOP_WORDS = FUNCTION_TERMS | frozenset(
    [
        "are",
        "is",
        "was",
        "were",
        "been",
        "being",
        "am",
        "has",
        "had",
        "having",
        "does",
        "did",
        "doing",
        "done",
        "into",
        "onto",
        "upon",
        "about",
        "over",
        "under",
        "again",
        "further",
        "once",
        "both",
        "few",
        "nor",
        "own",
        "same",
        "off",
        "out",
        "up",
        "down",
        "while",
        "during",
        "before",
        "after",
        "above",
        "below",
        "between",
        "through",
        "until",
        "against",
        "because",
        "yes",
        "per",
        "via",
        "within",
        "without",
        "among",
        "whether",
        "although",
        "though",
        "since",
        "therefore",
        "however",
        "thus",
        "hence",
    ]
)
IRREGULAR = {
    "is": "be",
    "are": "be",
    "was": "be",
    "were": "be",
    "been": "be",
    "am": "be",
    "being": "be",
    "has": "have",
    "had": "have",
    "having": "have",
    "does": "do",
    "did": "do",
    "done": "do",
    "went": "go",
    "gone": "go",
    "took": "take",
    "taken": "take",
    "made": "make",
    "gave": "give",
    "given": "give",
    "said": "say",
    "saw": "see",
    "seen": "see",
    "came": "come",
    "got": "get",
    "held": "hold",
    "left": "leave",
    "brought": "bring",
    "thought": "think",
    "found": "find",
    "told": "tell",
    "became": "become",
    "began": "begin",
    "begun": "begin",
    "kept": "keep",
    "meant": "mean",
    "met": "meet",
    "paid": "pay",
    "put": "put",
    "set": "set",
    "run": "run",
    "ran": "run",
    "spoke": "speak",
    "spoken": "speak",
    "written": "write",
    "wrote": "write",
    "men": "man",
    "women": "woman",
    "children": "child",
    "people": "person",
    "better": "good",
    "best": "good",
    "worse": "bad",
    "worst": "bad",
    "lost": "lose",
    "sent": "send",
    "stood": "stand",
    "understood": "understand",
    "felt": "feel",
    "led": "lead",
    "won": "win",
    "chose": "choose",
    "chosen": "choose",
    "fell": "fall",
    "fallen": "fall",
    "drew": "draw",
    "drawn": "draw",
    "shown": "show",
    "known": "know",
    "knew": "know",
    "grew": "grow",
    "grown": "grow",
    "rose": "rise",
    "risen": "rise",
    "sought": "seek",
    "taught": "teach",
    "bought": "buy",
    "built": "build",
    "dealt": "deal",
    "heard": "hear",
    "laid": "lay",
    "lay": "lie",
    "read": "read",
    "sold": "sell",
    "spent": "spend",
    "struck": "strike",
    "its": "it",
    "their": "they",
    "our": "we",
    "his": "he",
    "her": "she",
    "my": "i",
}
SUFFIXES = (
    "ations",
    "ation",
    "ments",
    "ment",
    "ness",
    "ings",
    "ing",
    "ies",
    "ied",
    "ers",
    "er",
    "est",
    "ed",
    "es",
    "ly",
    "s",
)


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


class GlossPotential(Potential):
    name = "task"
    on_prefix = True

    def prefix(self, example: Example, text: str) -> float:
        return gloss_penalty(example.input, gloss_terms_of(text, False), complete=False)

    def complete(self, example: Example, texts: list[str]) -> list[float]:
        return [gloss_penalty(example.input, gloss_terms_of(t, True), complete=True) for t in texts]


# ---------------------------------------------------------------------- factory


def default_potential(method: str) -> str:
    """The paper's pairing: reverse for Sample-Rerank and Full IS, task for Full SMC."""
    return "task" if method == "smc" else "reverse"


def make_potential(name: str, task: Task, model: Any = None, tokenizer: Any = None) -> Potential:
    if name == "none":
        return Potential()
    if name == "task":
        if task.name == "conll":
            return ConllPotential()
        if task.name == "gloss":
            return GlossPotential()
        raise ConfigError(
            f"search.potential=task: task {task.name} has no task-specific potential (the paper "
            "defines them for conll and gloss); use search.potential=reverse or none"
        )
    if name == "reverse":
        from grammarrl.rewards import ReferenceScorer

        return ReversePotential(ReferenceScorer(model, tokenizer, task))
    raise ConfigError(f"search.potential={name!r}: expected one of {', '.join(POTENTIALS)}")
