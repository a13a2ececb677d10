"""Paired comparisons of two systems measured on the same test sets (or dev inputs).

- `differences`: per-set score differences, system − reference.
- `paired_bootstrap`: the mean over shared sets of score(system) − score(reference), each set
  given as both systems' per-example statistics (draws × examples × statistics, examples in the
  same order: [tp, fp, fn] for micro-F1, BLEU's for BLEU; `experiments.intervals.set_score`);
  each resample draws every set's examples with replacement, the same for both systems,
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

from experiments.intervals import RESAMPLES, SEED, item_counts, set_score
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


def _draw_scores(weights: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The score of each draw (counts: draws × examples × statistics) in each resample."""
    return set_score(np.tensordot(weights, counts, axes=([1], [1])))


def _resampled_draws(rng: np.random.Generator, scores: np.ndarray) -> np.ndarray:
    """Each resample's mean score over its draws drawn with replacement (resamples × draws)."""
    picked = rng.integers(0, scores.shape[1], size=scores.shape)
    return np.take_along_axis(scores, picked, axis=1).mean(1)


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
    """The mean over shared sets of score(system) − score(reference), each set given as
    (system's, reference's) statistics, draws × examples × statistics, examples in the same
    order. Each resample draws every set's examples with replacement, the same for both
    systems, and each system's draws with replacement ("examples_and_draws", only when
    `draws`) or keeps them ("examples"); a set's score is the mean over draws of `set_score` of
    the resampled examples' summed statistics. Each interval: observed, 2.5th and 97.5th
    percentile, share above 0."""
    rng = np.random.default_rng(seed)
    both, examples = np.zeros(resamples), np.zeros(resamples)
    observed = 0.0
    for system, reference in pairs:
        observed += float(set_score(system.sum(1)).mean() - set_score(reference.sum(1)).mean())
        weights = _example_weights(rng, system.shape[1], resamples)
        ours, theirs = _draw_scores(weights, system), _draw_scores(weights, reference)
        examples += ours.mean(1) - theirs.mean(1)
        if draws:
            both += _resampled_draws(rng, ours) - _resampled_draws(rng, theirs)
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
