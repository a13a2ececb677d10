"""What a system's outputs hold, from its predictions file (tasks whose per-example scores count
true positives, false positives and false negatives: CoNLL): micro precision and recall, entities
predicted per output, per-field precision and recall, output length, and how often it emits the
very output of a reference system for the same input. It separates "emits more of what the
reference emits" from "emits the right ones"."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from experiments.intervals import COUNTS
from experiments.runs import AggregationError
from experiments.systems import System, counted_predictions
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.runs.results import mean_std
from grammarrl.tasks.metrics import entity_prf

Rows = Sequence[dict[str, Any]]


def per_set(rows: Rows) -> dict[int, list[dict[str, Any]]]:
    """Predictions rows by test set, in set order."""
    sets: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        sets.setdefault(int(row["set"]), []).append(row)
    return dict(sorted(sets.items()))


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def set_statistics(rows: Rows) -> dict[str, float]:
    """Micro precision and recall of one test set's outputs, and the fields filled (predicted
    entities) and gold entities per output."""
    tp, fp, fn = (sum(row["scores"][k] for row in rows) for k in COUNTS)
    return {
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "predicted": _ratio(tp + fp, len(rows)),
        "gold": _ratio(tp + fn, len(rows)),
    }


def field_statistics(
    rows: Rows,
    fields: Sequence[str],
    parse: Callable[[str], Mapping[str, str]],
    gold: Mapping[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """Per field and over all fields ("micro"), precision and recall of the rows' outputs
    against their gold (both read by `parse`, e.g. `grammarrl.tasks.conll.output_fields`): the
    row's `gold`, else `gold[uid]` (validation records hold no gold); and the mean output length
    in tokens under "length" where the rows record it (`num_tokens`)."""
    golds = [parse(_gold(row, gold or {})) for row in rows]
    counts = entity_prf([parse(row["prediction"]) for row in rows], golds, fields)
    found = {name: {"precision": c.precision, "recall": c.recall} for name, c in counts.items()}
    tokens = [row["num_tokens"] for row in rows if "num_tokens" in row]
    if tokens:
        found["length"] = {"tokens": sum(tokens) / len(tokens)}
    return found


def _gold(row: Mapping[str, Any], gold: Mapping[str, str]) -> str:
    if "gold" in row:
        return row["gold"]
    if row["uid"] not in gold:
        raise AggregationError(f"example {row['uid']}: no gold in its row nor in the golds given")
    return gold[row["uid"]]


def agreement(rows: Rows, other: Rows) -> list[float]:
    """Per test set, the share of outputs identical to the other system's for the same input."""
    theirs = {(int(r["set"]), r["uid"]): r["prediction"] for r in other}
    return [
        _ratio(sum(theirs.get((s, r["uid"])) == r["prediction"] for r in part), len(part))
        for s, part in per_set(rows).items()
    ]


def outputs_table(
    systems: Sequence[System], references: Sequence[System], title: str
) -> Table | None:
    """One row per system whose predictions count tp/fp/fn: precision, recall, entities per
    output, and its agreement with each reference; None when no system's predictions count
    them (gloss, WoS) or the first reference's are missing."""
    read = counted_predictions(systems)
    unread = [
        row.label
        for row in systems
        if row.present and not row.paired_selection and row.label not in read
    ]
    names = [ref.label for ref in references]
    if names[0] not in read:
        return None
    rows_out, gold = [], []
    for label, rows in read.items():
        stats = [set_statistics(part) for part in per_set(rows).values()]
        gold += [s["gold"] for s in stats]
        cells = [Cell(*mean_std([s[k] for s in stats])) for k in ("precision", "recall")]
        cells.append(Cell(*mean_std([s["predicted"] for s in stats])))
        cells += [
            Cell(*mean_std(agreement(rows, read[name]))) if name in read else Cell(text="missing")
            for name in names
        ]
        rows_out.append(Row(label, cells))
    return Table(
        "outputs",
        f"{title}, what the outputs hold on the test sets: micro precision and recall of "
        "the entities, entities predicted per output (the gold outputs hold "
        f"{mean_std(gold)[0]:.2f}), and the share of outputs identical to "
        + " and to ".join(f"{name}'s" for name in names)
        + " for the same input; mean ± std over test sets.",
        ["System", "precision", "recall", "entities / output", *(f"= {n}" for n in names)],
        [Block(rows_out)],
        best=None,
        notes=[f"No predictions with entity counts: {', '.join(unread)}."] if unread else [],
    )
