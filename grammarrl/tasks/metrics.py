"""Task metrics as pure functions: corpus BLEU, hierarchical F1, entity micro-F1, validity.

Invalid (unparseable) predictions are passed in as `None` and score as empty outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PRF:
    """Counts and precision / recall / F1 (0 when a denominator is 0)."""

    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def __add__(self, other: PRF) -> PRF:
        return PRF(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "precision": self.precision, "recall": self.recall, "f1": self.f1}


def corpus_bleu(predictions: Sequence[str | None], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults) on a 0-1 scale; `None` predictions count as ""."""
    import sacrebleu

    _same_length(predictions, references)
    hypotheses = [p or "" for p in predictions]
    return sacrebleu.corpus_bleu(hypotheses, [list(references)]).score / 100.0


def _path_labels(path: tuple[str, str] | None) -> set[tuple[str, ...]]:
    """A (parent, child) label augmented with its ancestor: {(parent,), (parent, child)}."""
    if path is None:
        return set()
    parent, child = path
    return {(parent,), (parent, child)}


def hierarchical_prf(
    predictions: Sequence[tuple[str, str] | None], golds: Sequence[tuple[str, str]]
) -> PRF:
    """Micro-averaged hierarchical P/R/F1: labels augmented with their ancestors.

    A child counts only under its correct parent, since the child label is the full path.
    """
    _same_length(predictions, golds)
    total = PRF(0, 0, 0)
    for predicted, gold in zip(predictions, golds):
        p, g = _path_labels(predicted), _path_labels(gold)
        total += PRF(len(p & g), len(p - g), len(g - p))
    return total


def field_prf(pred: str, gold: str) -> PRF:
    """One field of an entity record: tp if gold non-empty and pred == gold;
    fp if pred non-empty and pred != gold; fn if gold non-empty and pred != gold."""
    return PRF(
        tp=int(bool(gold) and pred == gold),
        fp=int(bool(pred) and pred != gold),
        fn=int(bool(gold) and pred != gold),
    )


def entity_prf(
    predictions: Sequence[Mapping[str, str] | None],
    golds: Sequence[Mapping[str, str]],
    fields: Sequence[str],
) -> dict[str, PRF]:
    """Per-field counts and their micro-average (key "micro") over all fields and examples."""
    _same_length(predictions, golds)
    per_field = {name: PRF(0, 0, 0) for name in fields}
    for predicted, gold in zip(predictions, golds):
        for name in fields:
            per_field[name] += field_prf((predicted or {}).get(name, ""), gold.get(name, ""))
    micro = PRF(0, 0, 0)
    for counts in per_field.values():
        micro += counts
    return {**per_field, "micro": micro}


def validity_rate(valid: Sequence[bool]) -> float:
    """The fraction of predictions that parse (1.0 for an empty list)."""
    return sum(map(bool, valid)) / len(valid) if valid else 1.0


def _same_length(predictions: Sequence, golds: Sequence) -> None:
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions for {len(golds)} examples")
