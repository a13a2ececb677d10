"""Per-example counts for every metric that sums over examples (experiments.intervals.item_counts):
the micro-F1 of a set's counts must be the set's own score, so that the paired bootstrap of the
comparison covers WoS, the custom tasks' accuracy and their JSON-field F1 as it covers CoNLL."""

from __future__ import annotations

import random

import numpy as np
import pytest

from experiments.intervals import counts_of, item_counts, micro_f1
from experiments.paired import counts_by_set, paired_interval
from experiments.runs import AggregationError
from grammarrl.tasks.metrics import hierarchical_prf

PARENTS = ("CS", "ECE", "Civil")
CHILDREN = ("a", "b")


def _wos_item(predicted: tuple[str, str] | None, gold: tuple[str, str]) -> dict[str, object]:
    """The per-example scores WoS records (grammarrl/tasks/wos.py)."""
    return {
        "valid": predicted is not None,
        "parent_correct": predicted is not None and predicted[0] == gold[0],
        "path_correct": predicted == gold,
    }


def test_wos_counts_give_the_hierarchical_f1_of_the_task() -> None:
    rng = random.Random(0)
    labels = [(p, c) for p in PARENTS for c in CHILDREN]
    golds = [rng.choice(labels) for _ in range(200)]
    preds = [rng.choice([*labels, None]) for _ in range(200)]
    counts = counts_of([_wos_item(p, g) for p, g in zip(preds, golds)])
    assert counts is not None
    assert float(micro_f1(counts.sum(0))) == pytest.approx(hierarchical_prf(preds, golds).f1)


def test_a_correct_flag_counts_as_the_share_right() -> None:
    flags = [True, False, False, True, True]
    counts = counts_of([{"valid": True, "correct": c} for c in flags])
    assert counts is not None
    assert counts.tolist()[:2] == [[1, 0, 0], [0, 1, 1]]
    assert float(micro_f1(counts.sum(0))) == pytest.approx(3 / 5)


def test_own_counts_are_kept_and_a_bleu_item_has_none() -> None:
    assert item_counts({"tp": 2, "fp": 1, "fn": 0, "correct": False}).tolist() == [2, 1, 0]
    assert item_counts({"uid": "x", "valid": True}) is None
    assert counts_of([{"tp": 1, "fp": 0, "fn": 0}, {"valid": True}]) is None


def test_accuracy_rows_get_a_paired_interval_and_uncounted_rows_are_refused() -> None:
    better = [{"set": 0, "uid": str(i), "scores": {"correct": i % 4 != 0}} for i in range(400)]
    worse = [{"set": 0, "uid": str(i), "scores": {"correct": i % 2 == 0}} for i in range(400)]
    observed, low, high, _ = paired_interval(counts_by_set(better), counts_by_set(worse))
    assert observed == pytest.approx(0.75 - 0.5)
    assert 0 < low < observed < high
    with pytest.raises(AggregationError, match="example 3 has no counts"):
        counts_by_set([*better[:3], {"set": 0, "uid": "3", "scores": {"valid": True}}])
    assert np.array_equal(counts_by_set(better)[0]["1"], [1, 0, 0])
