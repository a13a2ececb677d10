"""Paired comparisons of two systems measured on the same test sets (or dev inputs).

- `differences`: per-set score differences, system − reference.
- `paired_bootstrap`: the mean over shared sets of micro-F1(system) − micro-F1(reference), each
  set given as both systems' per-example [tp, fp, fn] (draws × examples × 3, examples in the same
  order); each resample draws every set's examples with replacement, the same for both systems,
  and, when asked, each system's draws (a search method's sampler seeds).
- `paired_interval`: the same over examples keyed by id (`counts_by_set`: test set → uid →
  counts, from predictions rows or a validation record), refusing systems that scored
  different examples.

scipy's `bootstrap` has no strata (the sets) and no paired draws, so the resampling is written
out with numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments.intervals import RESAMPLES, SEED, item_counts, micro_f1
from experiments.runs import AggregationError

Counts = dict[Any, dict[str, np.ndarray]]  # test set -> uid -> [tp, fp, fn]


def differences(scores: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Per-set differences scores − reference, set by set."""
    return [a - b for a, b in zip(scores, reference)]


def counts_by_set(rows: Iterable[Mapping[str, Any]], key: str = "set") -> Counts:
    """Per test set (the rows' `key` field), each example's [tp, fp, fn] from its `scores`
    (`experiments.intervals.item_counts`); an example listed twice in one set, or one without
    counts, is an error (it would be counted once, or not at all)."""
    sets: Counts = {}
    for row in rows:
        per_set = sets.setdefault(row[key], {})
        if row["uid"] in per_set:
            raise AggregationError(f"test set {row[key]}: example {row['uid']} listed twice")
        counts = item_counts(row["scores"])
        if counts is None:
            raise AggregationError(f"test set {row[key]}: example {row['uid']} has no counts")
        per_set[row["uid"]] = counts
    return sets


def _example_weights(rng: np.random.Generator, size: int, resamples: int) -> np.ndarray:
    """How often each example is drawn in each resample (examples drawn with replacement)."""
    drawn = rng.integers(0, size, size=(resamples, size)) + size * np.arange(resamples)[:, None]
    return np.bincount(drawn.ravel(), minlength=resamples * size).reshape(resamples, size)


def _draw_f1(weights: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Micro-F1 of each draw (counts: draws × examples × [tp, fp, fn]) in each resample."""
    return micro_f1(np.tensordot(weights.astype(float), counts.astype(float), axes=([1], [1])))


def _resampled_draws(rng: np.random.Generator, f1: np.ndarray) -> np.ndarray:
    """Each resample's mean F1 over its draws drawn with replacement (resamples × draws)."""
    picked = rng.integers(0, f1.shape[1], size=f1.shape)
    return np.take_along_axis(f1, picked, axis=1).mean(1)


def _interval(observed: float, values: np.ndarray) -> dict[str, float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return {
        "observed": observed,
        "low": float(low),
        "high": float(high),
        "p_above_zero": float((values > 0).mean()),
    }


def paired_bootstrap(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    resamples: int = RESAMPLES,
    seed: int = SEED,
    draws: bool = True,
) -> dict[str, dict[str, float]]:
    """The mean over shared sets of F1(system) − F1(reference), each set given as (system's,
    reference's) counts, draws × examples × [tp, fp, fn], examples in the same order. Each
    resample draws every set's examples with replacement, the same for both systems, and each
    system's draws with replacement ("examples_and_draws", only when `draws`) or keeps them
    ("examples"); a set's F1 is the mean over draws of the micro-F1 of the resampled examples'
    summed counts. Each interval: observed, 2.5th and 97.5th percentile, share above 0."""
    rng = np.random.default_rng(seed)
    both, examples = np.zeros(resamples), np.zeros(resamples)
    observed = 0.0
    for system, reference in pairs:
        observed += float(micro_f1(system.sum(1)).mean() - micro_f1(reference.sum(1)).mean())
        weights = _example_weights(rng, system.shape[1], resamples)
        f1_system, f1_reference = _draw_f1(weights, system), _draw_f1(weights, reference)
        examples += f1_system.mean(1) - f1_reference.mean(1)
        if draws:
            both += _resampled_draws(rng, f1_system) - _resampled_draws(rng, f1_reference)
    count = len(pairs)
    found = {"examples_and_draws": _interval(observed / count, both / count)} if draws else {}
    return found | {"examples": _interval(observed / count, examples / count)}


def paired_interval(
    system: Counts, reference: Counts, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float, float]:
    """(observed difference, 2.5th and 97.5th percentile, share of resamples above 0) of the
    mean over sets of micro-F1(system) − micro-F1(reference), the same examples drawn with
    replacement for both within each set (sets and examples in sorted order)."""
    if system.keys() != reference.keys() or any(
        system[s].keys() != reference[s].keys() for s in system
    ):
        raise AggregationError("paired bootstrap: the two systems scored different examples")
    pairs = [
        tuple(
            np.stack([side[s][u] for u in sorted(system[s])])[None] for side in (system, reference)
        )
        for s in sorted(system)
    ]
    found = paired_bootstrap(pairs, resamples, seed, draws=False)["examples"]
    return found["observed"], found["low"], found["high"], found["p_above_zero"]
