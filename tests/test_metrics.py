"""Metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from grammarrl.tasks.metrics import (
    PRF,
    corpus_bleu,
    entity_prf,
    field_prf,
    hierarchical_prf,
    validity_rate,
)

FIELDS = ("person", "organization", "location", "misc")


def test_prf_arithmetic():
    counts = PRF(tp=3, fp=1, fn=2)
    assert counts.precision == pytest.approx(0.75)
    assert counts.recall == pytest.approx(0.6)
    assert counts.f1 == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    assert PRF(0, 0, 0).f1 == 0.0
    assert counts + PRF(1, 1, 1) == PRF(4, 2, 3)


def test_corpus_bleu_identity_and_hand_value():
    refs = ["A B C D E", "F G H I J"]
    assert corpus_bleu(refs, refs) == pytest.approx(1.0)
    # One hypothesis "A B C D X" vs "A B C D E": n-gram precisions 4/5, 3/4, 2/3, 1/2, no
    # brevity penalty: BLEU = (4/5 * 3/4 * 2/3 * 1/2) ** (1/4).
    expected = (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** 0.25
    assert corpus_bleu(["A B C D X"], ["A B C D E"]) == pytest.approx(expected, abs=1e-4)
    assert corpus_bleu([None, None], refs) == 0.0  # invalid predictions score as empty


def test_hierarchical_f1_counts_child_only_under_its_parent():
    golds = [("CS", "Machine learning"), ("Medical", "Depression"), ("ECE", "PID controller")]
    preds = [
        ("CS", "Machine learning"),  # parent + path right: tp 2
        ("Psychology", "Depression"),  # same child name, wrong parent: fp 2, fn 2
        None,  # invalid: fn 2
    ]
    counts = hierarchical_prf(preds, golds)
    assert counts == PRF(tp=2, fp=2, fn=4)
    assert counts.precision == pytest.approx(0.5)
    assert counts.recall == pytest.approx(2 / 6)
    assert counts.f1 == pytest.approx(0.4)
    # Right parent, wrong child: the parent label still counts.
    assert hierarchical_prf([("CS", "Cryptography")], [("CS", "Machine learning")]) == PRF(1, 1, 1)


def test_entity_field_rule():
    assert field_prf("Paris", "Paris") == PRF(1, 0, 0)
    assert field_prf("Lyon", "Paris") == PRF(0, 1, 1)
    assert field_prf("", "Paris") == PRF(0, 0, 1)
    assert field_prf("Paris", "") == PRF(0, 1, 0)
    assert field_prf("", "") == PRF(0, 0, 0)


def test_entity_micro_f1_by_hand():
    golds = [
        {"person": "Ann Lee", "organization": "", "location": "Oslo", "misc": ""},
        {"person": "", "organization": "ACME", "location": "", "misc": "Dutch"},
    ]
    preds = [
        {"person": "Ann Lee", "organization": "", "location": "Bergen", "misc": "Dutch"},
        None,  # invalid: every gold field is a miss
    ]
    counts = entity_prf(preds, golds, FIELDS)
    assert counts["person"] == PRF(1, 0, 0)
    assert counts["location"] == PRF(0, 1, 1)
    assert counts["misc"] == PRF(0, 1, 1)
    assert counts["organization"] == PRF(0, 0, 1)
    micro = counts["micro"]
    assert micro == PRF(tp=1, fp=2, fn=3)
    assert micro.f1 == pytest.approx(2 * (1 / 3) * (1 / 4) / (1 / 3 + 1 / 4))


def test_validity_rate_and_length_check():
    assert validity_rate([True, False, True, True]) == 0.75
    assert validity_rate([]) == 1.0
    with pytest.raises(ValueError, match="2 predictions for 1 examples"):
        hierarchical_prf([None, None], [("CS", "Cryptography")])
    assert not math.isnan(corpus_bleu([""], ["A"]))
