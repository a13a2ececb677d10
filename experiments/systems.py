"""Systems compared side by side on the same seeded test sets, set by set (by index): a row per
system (its evaluation and per-set scores), the check that every row was scored on the same test
sets and weights dtype, the comparison table (mean ± std, each set, paired per-set differences
against reference rows) and the paired bootstrap table over the test examples."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiments.analysis import read_predictions
from experiments.intervals import RESAMPLES, SEED, item_counts
from experiments.paired import counts_by_set, differences, paired_interval
from experiments.runs import AggregationError, Evaluation, metric_label
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.runs.results import mean_std

MISSING = "missing"
# What fixes the seeded test sets: rows that differ in any of these were scored on other sets.
TEST_SET_KEYS = (
    "task.name",
    "data.split_seed",
    "eval.num_test_sets",
    "eval.test_size",
    "eval.test_set_drawing",  # set i of one drawing is not set i of another
    "seed",
)


@dataclass(frozen=True)
class System:
    """One row of a comparison: the evaluation behind it (for a selection on another method's
    particles, that method's) and its per-set scores; None when missing."""

    label: str
    evaluation: Evaluation | None
    scores: tuple[float, ...] | None = None
    role: str = ""  # what the study calls the rows others refer to (`by_role`)
    paired_selection: bool = False  # selected among another method's particles: no own outputs

    @property
    def present(self) -> bool:
        return self.scores is not None

    def rewards(self) -> list[tuple[float, float]] | None:
        """Per test set (mean R_direct, mean R_reverse) of its outputs; None when not scored."""
        if self.evaluation is None or self.paired_selection:
            return None
        values = [
            (s.get("reward_direct"), s.get("reward_reverse"))
            for s in self.evaluation.results.get("per_set") or []
        ]
        if not values or not all(_finite(d) and _finite(r) for d, r in values):
            return None
        return [(float(d), float(r)) for d, r in values]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def system(label: str, ev: Evaluation | None, role: str = "") -> System:
    return System(label, ev, tuple(ev.scores) if ev else None, role)


def by_role(systems: Sequence[System], role: str) -> System:
    return next(row for row in systems if row.role == role)


def metric_of(systems: Sequence[System]) -> str:
    """The readable name of the metric the rows were scored with."""
    return metric_label(next((r.evaluation.metric for r in systems if r.evaluation), "metric"))


def check_test_sets(systems: Sequence[System]) -> None:
    """Refuse rows scored on other test sets (task, split seed, number, size, seed) or with
    model weights in another dtype (`model.dtype=auto` differs between machines; a results file
    that does not record its dtype is taken as compatible)."""
    scored = [row for row in systems if row.evaluation is not None]
    for name, key_of in (
        ("different test sets", _test_set_key),
        ("another dtype", lambda row: row.evaluation.results.get("dtype")),
    ):
        groups: dict[Any, list[System]] = {}
        for row in scored:
            key = key_of(row)
            if key is not None:
                groups.setdefault(key, []).append(row)
        if len(groups) > 1:
            lines = [
                f"{_describe_key(key)}: "
                + "; ".join(f"{row.label} ({row.evaluation.run.path})" for row in rows)
                for key, rows in groups.items()
            ]
            raise AggregationError(
                f"the compared rows were evaluated on {name}:\n  " + "\n  ".join(lines)
            )


def _test_set_key(row: System) -> tuple[Any, ...]:
    values = tuple(row.evaluation.get(k) for k in TEST_SET_KEYS) + (len(row.scores or ()),)
    return tuple(zip((*TEST_SET_KEYS, "sets scored"), values))


def _describe_key(key: Any) -> str:
    if isinstance(key, tuple):
        return ", ".join(f"{k}={v}" for k, v in key)
    return f"dtype={key}"


def listed(values: Sequence[float], signed: bool = False) -> str:
    return ", ".join(f"{v:+.3f}" if signed else f"{v:.3f}" for v in values)


def paired_cells(row: System, reference: System) -> list[Cell]:
    """(mean ± std of the per-set differences row − reference, the differences themselves)."""
    if row is reference or not (row.present and reference.present):
        return [Cell(), Cell()]
    diffs = differences(row.scores, reference.scores)
    return [Cell(*mean_std(diffs)), Cell(text=listed(diffs, signed=True))]


def sets_text(systems: Sequence[System]) -> str:
    """`3 test sets of 100 (seed 0)`, from the first scored row's config."""
    ev = next((row.evaluation for row in systems if row.evaluation is not None), None)
    if ev is None:
        return "test sets"
    return (
        f"{ev.get('eval.num_test_sets')} test sets of {ev.get('eval.test_size')} (seed "
        f"{ev.get('seed')})"
    )


def comparison_table(
    systems: Sequence[System], references: Sequence[System], caption: str
) -> Table:
    """One row per system: its metric's mean ± std over sets, each set, and per reference the
    paired per-set differences (mean ± std, each); a missing row reads "missing"."""
    width = 2 + 2 * len(references)
    rows = []
    for row in systems:
        if not row.present:
            rows.append(Row(row.label, [Cell(text=MISSING)] + [Cell() for _ in range(width - 1)]))
            continue
        cells = [Cell(*mean_std(row.scores)), Cell(text=listed(row.scores))]
        rows.append(Row(row.label, cells + [c for r in references for c in paired_cells(row, r)]))
    header = ["System", metric_of(systems), "per set"]
    for reference in references:
        header += [f"diff. vs {reference.label}", "per set"]
    return Table("comparison", caption, header, [Block(rows)]).mark_best()


def counted_predictions(systems: Sequence[System]) -> dict[str, list[dict[str, Any]]]:
    """The predictions of every scored system whose per-example scores count tp/fp/fn, by
    label (a paired selection has no outputs of its own)."""
    scored = [row for row in systems if row.present and not row.paired_selection]
    read = {
        row.label: read_predictions(row.evaluation)
        for row in scored
        if row.evaluation.predictions.is_file()
    }
    return {label: rows for label, rows in read.items() if _counted(rows)}


def _counted(rows: Sequence[dict[str, Any]]) -> bool:
    return bool(rows) and all(
        isinstance(row.get("scores"), dict) and item_counts(row["scores"]) is not None
        for row in rows
    )


def _interval_cells(counts: Any, reference: Any, same: bool) -> list[Cell]:
    if same or reference is None:
        return [Cell(), Cell(), Cell()]
    observed, low, high, above = paired_interval(counts, reference)
    return [
        Cell(text=f"{observed:+.3f}"),
        Cell(text=f"[{low:+.3f}, {high:+.3f}]"),
        Cell(text=f"{above:.3f}"),
    ]


def bootstrap_table(
    systems: Sequence[System], references: Sequence[System], title: str
) -> Table | None:
    """Each system with counted predictions against each reference: the mean over sets of the
    per-set micro-F1 difference, its 95% interval over the test examples and P(ahead); None
    when the task's predictions count no entities or the first reference's are missing."""
    read = {label: counts_by_set(rows) for label, rows in counted_predictions(systems).items()}
    if references[0].label not in read:
        return None
    rows = [
        Row(
            label,
            [
                cell
                for ref in references
                for cell in _interval_cells(counts, read.get(ref.label), label == ref.label)
            ],
        )
        for label, counts in read.items()
    ]
    header = ["System"]
    for reference in references:
        header += [f"diff. vs {reference.label}", "95% interval", "P(ahead)"]
    return Table(
        "paired_bootstrap",
        f"{title}, paired bootstrap over test examples: the comparison's statistic (mean over "
        "test sets of the per-set micro-F1 difference, row − reference), its 95% interval when "
        f"each set's examples are drawn with replacement ({RESAMPLES:,} resamples, seed {SEED}, "
        "the same draws for both systems), and the share of resamples in which the row is "
        "ahead. The examples are the only noise resampled; training seeds are not.",
        header,
        [Block(rows)],
        best=None,
    )
