"""The paired bootstrap of Evidence II's comparison (`experiments/paired.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.intervals import micro_f1
from experiments.paired import counts_by_set as _counts
from experiments.paired import paired_interval as paired_bootstrap
from experiments.runs import AggregationError


def counts(rows: list[list[tuple[int, int, int]]]) -> dict[int, dict[str, np.ndarray]]:
    """Test set -> uid -> [tp, fp, fn], uids e0, e1, ... per set."""
    return {
        s: {f"e{i}": np.array(c) for i, c in enumerate(per_set)} for s, per_set in enumerate(rows)
    }


def per_set_f1(sets: dict[int, dict[str, np.ndarray]]) -> list[float]:
    out = []
    for s in sorted(sets):
        tp, fp, fn = np.sum(list(sets[s].values()), axis=0)
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        out.append(2 * p * r / (p + r) if p + r else 0.0)
    return out


@pytest.fixture
def pair() -> tuple[dict, dict]:
    rng = np.random.default_rng(7)
    a = counts(rng.integers(0, 3, size=(3, 40, 3)).tolist())
    b = counts(rng.integers(0, 3, size=(3, 40, 3)).tolist())
    return a, b


def test_the_observed_difference_is_the_mean_of_the_per_set_f1_differences(pair):
    a, b = pair
    observed, low, high, _ = paired_bootstrap(a, b, resamples=2000)
    expected = np.mean(np.array(per_set_f1(a)) - np.array(per_set_f1(b)))
    assert observed == pytest.approx(expected)
    assert low < observed < high


def test_micro_f1_is_the_harmonic_mean_of_precision_and_recall():
    totals = np.array([[3, 1, 2], [0, 0, 0], [0, 4, 1]])
    assert micro_f1(totals).tolist() == pytest.approx([2 * 0.75 * 0.6 / 1.35, 0.0, 0.0])


def test_identical_systems_differ_by_nothing_and_a_better_one_is_always_ahead(pair):
    a, _ = pair
    assert paired_bootstrap(a, a, resamples=500) == (0.0, 0.0, 0.0, 0.0)
    better = {s: {u: c + np.array([1, 0, 0]) for u, c in rows.items()} for s, rows in a.items()}
    observed, low, _, ahead = paired_bootstrap(better, a, resamples=500)
    assert observed > 0 and low > 0 and ahead == 1.0


def test_the_draws_are_seeded_and_paired(pair):
    a, b = pair
    assert paired_bootstrap(a, b, resamples=500) == paired_bootstrap(a, b, resamples=500)
    flipped = paired_bootstrap(b, a, resamples=500)
    observed, low, high, ahead = paired_bootstrap(a, b, resamples=500)
    assert flipped[0] == pytest.approx(-observed)
    assert (flipped[1], flipped[2]) == pytest.approx((-high, -low))
    assert flipped[3] == pytest.approx(1 - ahead)  # no ties: a continuous-ish difference


def test_systems_scored_on_different_examples_are_refused(pair):
    a, b = pair
    b[0]["other"] = b[0].pop("e0")
    with pytest.raises(AggregationError, match="different examples"):
        paired_bootstrap(a, b)


def test_an_example_listed_twice_in_a_set_is_refused():
    row = {"set": 0, "uid": "e0", "scores": {"tp": 1, "fp": 0, "fn": 0}}
    with pytest.raises(AggregationError, match="e0 listed twice"):
        _counts([row, dict(row)])
