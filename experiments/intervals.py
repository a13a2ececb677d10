"""Micro-F1 from per-example [tp, fp, fn] counts, and its bootstrap interval over examples: the
pieces the comparison, the paired bootstrap and the dev-selection table share.

Every metric whose set score is a sum over examples is counted this way (`item_counts`), so that
one paired bootstrap serves them all: micro-F1 (CoNLL) and the custom tasks' JSON-field F1
record tp/fp/fn per example; WoS's hierarchical F1 counts the parent and the full path of each
output; accuracy and exact match count a right output as [1, 0, 0] and a wrong one as
[0, 1, 1], whose micro-F1 over a set is the share right. Corpus BLEU is not a mean over
examples, but it is a function of summed per-example statistics too (sacrebleu's lengths and
n-gram matches, `bleu_statistics`, read from the output's text), as sacrebleu's own paired
bootstrap uses it; `set_score` turns either kind of summed statistics into the set's score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU

COUNTS = ("tp", "fp", "fn")
RESAMPLES = 10_000
SEED = 0


def micro_f1(totals: np.ndarray) -> np.ndarray:
    """Micro-F1 of summed [tp, fp, fn] along the last axis (0 where nothing was predicted or
    expected): 2tp / (2tp + fp + fn), the harmonic mean of precision and recall."""
    tp, fp, fn = totals[..., 0], totals[..., 1], totals[..., 2]
    denominator = 2 * tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros(tp.shape), where=denominator > 0)


COUNTED_METRICS = ("micro_f1", "json_fields_f1", "hierarchical_f1", "accuracy", "exact_match")
SUMMED_METRICS = (*COUNTED_METRICS, "bleu")  # every metric a paired bootstrap can resample

_BLEU = BLEU()  # sacrebleu's defaults, as `grammarrl.tasks.metrics.corpus_bleu` scores
_ORDER = _BLEU.max_ngram_order


def bleu_statistics(hypothesis: str, reference: str) -> np.ndarray:
    """One example's BLEU statistics: [hypothesis length, reference length, matched n-grams
    for n = 1..4, hypothesis n-grams for n = 1..4] (sacrebleu's tokenisation)."""
    found = _BLEU.corpus_score([hypothesis], [[reference]])
    return np.array([found.sys_len, found.ref_len, *found.counts, *found.totals], dtype=np.int64)


def corpus_bleu_of(totals: np.ndarray) -> np.ndarray:
    """Corpus BLEU on a 0-1 scale of summed `bleu_statistics` along the last axis (sacrebleu's
    `compute_bleu` with its default smoothing, one call per row)."""
    rows = totals.reshape(-1, totals.shape[-1]).tolist()
    scores = [
        _BLEU.compute_bleu(
            correct=row[2 : 2 + _ORDER],
            total=row[2 + _ORDER :],
            sys_len=row[0],
            ref_len=row[1],
            smooth_method=_BLEU.smooth_method,
        ).score
        / 100.0
        for row in rows
    ]
    return np.array(scores).reshape(totals.shape[:-1])


def set_score(totals: np.ndarray) -> np.ndarray:
    """A set's score from its examples' statistics summed along the last axis: micro-F1 of
    [tp, fp, fn], corpus BLEU of `bleu_statistics`."""
    return micro_f1(totals) if totals.shape[-1] == len(COUNTS) else corpus_bleu_of(totals)


def item_counts(item: Mapping[str, Any]) -> np.ndarray | None:
    """One example's [tp, fp, fn] from its per-example scores (module docstring): its own
    counts; WoS's `parent_correct` and `path_correct` as hierarchical-F1 counts (an invalid
    output predicts no label); a `correct` flag as [1, 0, 0] or [0, 1, 1]. None when the item
    holds none of these (an unlabelled example, a BLEU task)."""
    if all(k in item for k in COUNTS):
        return np.array([item[k] for k in COUNTS], dtype=np.int64)
    if "path_correct" in item:
        if not item.get("valid", True):
            return np.array([0, 0, 2], dtype=np.int64)
        right = int(bool(item["parent_correct"])) + int(bool(item["path_correct"]))
        return np.array([right, 2 - right, 2 - right], dtype=np.int64)
    if "correct" in item:
        wrong = 1 - int(bool(item["correct"]))
        return np.array([1 - wrong, wrong, wrong], dtype=np.int64)
    return None


def counts_of(items: Sequence[Mapping[str, Any]]) -> np.ndarray | None:
    """[examples, 3] counts of the task's per-example items (`item_counts`); None unless every
    item is counted."""
    counts = [item_counts(item) for item in items]
    if not counts or any(c is None for c in counts):
        return None
    return np.stack(counts)


def f1_interval(
    counts: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of micro-F1 over the examples resampled with
    replacement: how far another draw of as many inputs could move the score."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(counts), size=(resamples, len(counts)))
    low, high = np.percentile(micro_f1(counts[draws].sum(1)), [2.5, 97.5])
    return float(low), float(high)
