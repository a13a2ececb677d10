"""Evidence II, what each system's outputs look like (tasks whose per-example scores count true
positives, false positives and false negatives: CoNLL): precision and recall, how many fields
each output fills, and how often it emits the very output of frozen greedy or of Sample-Rerank.
It separates "emits more of what reranking emits" from "emits the right ones"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from experiments.analysis import read_predictions
from experiments.evidence_mechanism import System, by_role
from experiments.intervals import COUNTS
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.runs.results import mean_std


def _counted(rows: Sequence[dict[str, Any]]) -> bool:
    return bool(rows) and all(
        isinstance(row.get("scores"), dict) and all(k in row["scores"] for k in COUNTS)
        for row in rows
    )


def _per_set(rows: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    sets: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        sets.setdefault(int(row["set"]), []).append(row)
    return dict(sorted(sets.items()))


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def set_statistics(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Micro precision and recall of one test set's outputs, and the fields filled (predicted
    entities) and gold entities per output."""
    tp, fp, fn = (sum(row["scores"][k] for row in rows) for k in COUNTS)
    return {
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "predicted": _ratio(tp + fp, len(rows)),
        "gold": _ratio(tp + fn, len(rows)),
    }


def _agreement(rows: Sequence[dict[str, Any]], other: dict[tuple[int, str], str]) -> list[float]:
    """Per test set, the share of outputs identical to the other system's for the same input."""
    return [
        _ratio(sum(other.get((s, r["uid"])) == r["prediction"] for r in part), len(part))
        for s, part in _per_set(rows).items()
    ]


def counted_predictions(systems: Sequence[System]) -> dict[str, list[dict[str, Any]]]:
    """The predictions of every scored system whose per-example scores count tp/fp/fn, by
    label (the paired IS selection has no outputs of its own)."""
    scored = [row for row in systems if row.present and not row.paired_selection]
    read = {
        row.label: read_predictions(row.evaluation)
        for row in scored
        if row.evaluation.predictions.is_file()
    }
    return {label: rows for label, rows in read.items() if _counted(rows)}


def outputs_table(systems: Sequence[System]) -> Table | None:
    """One row per system whose predictions count tp/fp/fn; None when no system's do (gloss,
    WoS) or the frozen greedy row is missing."""
    read = counted_predictions(systems)
    unread = [
        row.label
        for row in systems
        if row.present and not row.paired_selection and row.label not in read
    ]
    greedy, rerank = by_role(systems, "greedy").label, by_role(systems, "rerank").label
    if greedy not in read:
        return None
    outputs = {
        label: {(int(r["set"]), r["uid"]): r["prediction"] for r in rows}
        for label, rows in read.items()
        if label in (greedy, rerank)
    }
    rows_out, gold = [], []
    for label, rows in read.items():
        stats = [set_statistics(part) for part in _per_set(rows).values()]
        gold += [s["gold"] for s in stats]
        cells = [Cell(*mean_std([s[k] for s in stats])) for k in ("precision", "recall")]
        cells.append(Cell(*mean_std([s["predicted"] for s in stats])))
        cells += [
            Cell(*mean_std(_agreement(rows, outputs[ref])))
            if ref in outputs
            else Cell(text="missing")
            for ref in (greedy, rerank)
        ]
        rows_out.append(Row(label, cells))
    return Table(
        "outputs",
        "Evidence II, what the outputs hold on the test sets: micro precision and recall of "
        "the entities, entities predicted per output (the gold outputs hold "
        f"{mean_std(gold)[0]:.2f}), and the share of outputs identical to frozen greedy's and "
        f"to {rerank}'s for the same input; mean ± std over test sets.",
        ["System", "precision", "recall", "entities / output", "= frozen greedy", f"= {rerank}"],
        [Block(rows_out)],
        best=None,
        notes=[f"No predictions with entity counts: {', '.join(unread)}."] if unread else [],
    )
