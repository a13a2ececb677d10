"""Evidence II, how sure a paired difference is when the test examples are the only noise: a
paired bootstrap over examples, resampled within each test set, of the same statistic the
comparison reports (the mean over sets of the per-set micro-F1 difference), for tasks whose
per-example scores count tp/fp/fn (CoNLL). Three per-set differences say little about a
difference of 0.01; 300 paired examples say more. Training seeds are not resampled: the
`training_seeds` table holds that part of the noise.

scipy's `bootstrap` has no strata (the sets), so the resampling is written out with numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments.evidence_mechanism import System, by_role
from experiments.evidence_outputs import counted_predictions
from experiments.intervals import COUNTS, RESAMPLES, SEED, micro_f1
from experiments.runs import AggregationError
from experiments.table_format import Block, Cell, Row, Table

Counts = dict[int, dict[str, np.ndarray]]  # test set -> uid -> [tp, fp, fn]


def _counts(rows: Sequence[dict[str, Any]]) -> Counts:
    """Per test set, each example's [tp, fp, fn]; an example listed twice in one set is an
    error (it would be counted once)."""
    sets: Counts = {}
    for row in rows:
        per_set = sets.setdefault(int(row["set"]), {})
        if row["uid"] in per_set:
            raise AggregationError(f"test set {row['set']}: example {row['uid']} listed twice")
        per_set[row["uid"]] = np.array([row["scores"][k] for k in COUNTS], dtype=np.int64)
    return sets


def paired_bootstrap(
    system: Counts, reference: Counts, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float, float]:
    """(observed difference, 2.5th and 97.5th percentile, share of resamples above 0) of the
    mean over test sets of micro-F1(system) − micro-F1(reference), the same examples drawn
    with replacement for both within each set."""
    if system.keys() != reference.keys() or any(
        system[s].keys() != reference[s].keys() for s in system
    ):
        raise AggregationError("paired bootstrap: the two systems scored different examples")
    rng = np.random.default_rng(seed)
    observed, resampled = 0.0, np.zeros(resamples)
    for s in sorted(system):
        uids = sorted(system[s])
        a = np.stack([system[s][u] for u in uids])
        b = np.stack([reference[s][u] for u in uids])
        observed += float(micro_f1(a.sum(0)) - micro_f1(b.sum(0)))
        draws = rng.integers(0, len(uids), size=(resamples, len(uids)))
        resampled += micro_f1(a[draws].sum(1)) - micro_f1(b[draws].sum(1))
    observed, resampled = observed / len(system), resampled / len(system)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return observed, float(low), float(high), float((resampled > 0).mean())


def _cells(system: Counts, reference: Counts | None, same: bool) -> list[Cell]:
    if same or reference is None:
        return [Cell(), Cell(), Cell()]
    observed, low, high, above = paired_bootstrap(system, reference)
    return [
        Cell(text=f"{observed:+.3f}"),
        Cell(text=f"[{low:+.3f}, {high:+.3f}]"),
        Cell(text=f"{above:.3f}"),
    ]


def bootstrap_table(systems: Sequence[System]) -> Table | None:
    """Each system with counted predictions against frozen greedy and Sample-Rerank; None when
    the task's predictions count no entities or frozen greedy's are missing."""
    read = {label: _counts(rows) for label, rows in counted_predictions(systems).items()}
    greedy, rerank = by_role(systems, "greedy").label, by_role(systems, "rerank").label
    if greedy not in read:
        return None
    rows = [
        Row(
            label,
            _cells(counts, read[greedy], label == greedy)
            + _cells(counts, read.get(rerank), label == rerank),
        )
        for label, counts in read.items()
    ]
    return Table(
        "paired_bootstrap",
        "Evidence II, paired bootstrap over test examples: the comparison's statistic (mean over "
        "test sets of the per-set micro-F1 difference, row − reference), its 95% interval when "
        f"each set's examples are drawn with replacement ({RESAMPLES:,} resamples, seed {SEED}, "
        "the same draws for both systems), and the share of resamples in which the row is "
        "ahead. The examples are the only noise resampled; training seeds are not.",
        [
            "System",
            "diff. vs frozen greedy",
            "95% interval",
            "P(ahead)",
            f"diff. vs {rerank}",
            "95% interval",
            "P(ahead)",
        ],
        [Block(rows)],
        best=None,
    )
