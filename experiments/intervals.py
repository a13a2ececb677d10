"""Micro-F1 from per-example [tp, fp, fn] counts, and its bootstrap interval over examples: the
pieces the comparison, the paired bootstrap and the dev-selection table share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

COUNTS = ("tp", "fp", "fn")
RESAMPLES = 10_000
SEED = 0


def micro_f1(totals: np.ndarray) -> np.ndarray:
    """Micro-F1 of summed [tp, fp, fn] along the last axis (0 where nothing was predicted or
    expected): 2tp / (2tp + fp + fn), the harmonic mean of precision and recall."""
    tp, fp, fn = totals[..., 0], totals[..., 1], totals[..., 2]
    denominator = 2 * tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros(tp.shape), where=denominator > 0)


def counts_of(items: Sequence[Mapping[str, Any]]) -> np.ndarray | None:
    """[examples, 3] counts of the task's per-example items; None unless every item counts
    tp/fp/fn (micro-F1 tasks)."""
    if not items or any(not all(k in item for k in COUNTS) for item in items):
        return None
    return np.array([[item[k] for k in COUNTS] for item in items], dtype=np.int64)


def f1_interval(
    counts: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of micro-F1 over the examples resampled with
    replacement: how far another draw of as many inputs could move the score."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(counts), size=(resamples, len(counts)))
    low, high = np.percentile(micro_f1(counts[draws].sum(1)), [2.5, 97.5])
    return float(low), float(high)
