"""One results file read for a comparison by distinct test set: its predictions rows, each test
set's example ids (normalised by `relative_uid`), each selection's score of each draw on each
set, the rows by (set, draw) and uid, and each set's per-example statistics where the set score
is a function of their sum (`experiments.intervals`): [tp, fp, fn] (`item_counts`; rescored from
the text in older CoNLL search files), or BLEU's statistics of the output's text; checked
against the results file's own score. Errors name the file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.intervals import SUMMED_METRICS, bleu_statistics, item_counts, set_score
from experiments.runs import AggregationError, Evaluation, load_sweep, read_jsonl
from grammarrl.data.sources import relative_uid
from grammarrl.tasks.conll import FIELDS, output_fields
from grammarrl.tasks.metrics import entity_prf

TOLERANCE = 1e-9
Grouped = dict[tuple[int, int], dict[str, dict[str, Any]]]  # (set, draw) -> uid -> row


def source(ev: Evaluation) -> str:
    """The results file, relative to the working directory."""
    return os.path.relpath(ev.run.path / f"{ev.name}.json")


def one_evaluation(path: Path) -> Evaluation:
    """The one evaluation (greedy, beam or search) recorded in a run folder, or the one a results
    file in it holds (a training run records two: its last and its dev-best adapter's)."""
    folder, name = (path.parent, path.stem) if path.suffix == ".json" else (path, None)
    evals = [ev for ev in load_sweep([folder]).evaluations() if name in (None, ev.name)]
    if len(evals) != 1:
        hint = " (name one of its results files)" if name is None and evals else ""
        raise AggregationError(f"{path}: expected one evaluation, found {len(evals)}{hint}")
    return evals[0]


def read_rows(ev: Evaluation) -> list[dict[str, Any]]:
    """The predictions rows of a results file; an error naming it when they are missing."""
    path = ev.predictions
    try:
        rows = read_jsonl(path)
    except OSError as err:
        raise AggregationError(
            f"{source(ev)}: cannot read its predictions {os.path.relpath(path)} ({err.strerror})"
        ) from None
    except json.JSONDecodeError as err:
        raise AggregationError(f"{os.path.relpath(path)}: not valid JSON lines ({err})") from None
    if not rows:
        raise AggregationError(f"{source(ev)}: its predictions {os.path.relpath(path)} are empty")
    return rows


def _uid(ev: Evaluation, uid: str) -> str:
    return relative_uid(str(uid), ev.get("data.dir"))


def set_uids(ev: Evaluation, rows: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Each test set's normalised uids in order: the results' `set_ids`, else (older files)
    those of the first draw's rows; one per set score, no uid twice in a set."""
    listed = ev.results.get("set_ids")
    if listed is None:
        by_set: dict[int, list[str]] = {}
        for row in rows:
            if int(row.get("draw", 0)) == 0:
                by_set.setdefault(int(row["set"]), []).append(row["uid"])
        listed = [by_set.get(index, []) for index in range(len(ev.scores))]
    sets = [tuple(_uid(ev, uid) for uid in uids) for uids in listed]
    if len(sets) != len(ev.scores):
        raise AggregationError(
            f"{source(ev)}: {len(sets)} test sets listed, {len(ev.scores)} set scores"
        )
    for index, uids in enumerate(sets):
        if not uids or len(set(uids)) != len(uids):
            raise AggregationError(f"{source(ev)}: test set {index} is empty or repeats a uid")
    return sets


def file_scores(ev: Evaluation) -> dict[str, list[list[float]]]:
    """Per selection, the results' score of each draw on each test set ([draw][set]); a
    results file that is not a search has one selection, its decoding."""
    main = {"scores": ev.scores, "per_draw": ev.results.get("scores_per_draw")}
    selections = ev.results.get("selections") if ev.mode == "search" else None
    return {
        name: [[float(s) for s in draw] for draw in (sel.get("per_draw") or [sel["scores"]])]
        for name, sel in (selections or {ev.decoding: main}).items()
    }


def grouped_rows(
    ev: Evaluation, rows: Sequence[dict[str, Any]], sets: Sequence[tuple[str, ...]], draws: int
) -> Grouped:
    """The rows by (set, draw), then by normalised uid; each (set, draw) must hold exactly
    the examples of its set."""
    grouped: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((int(row["set"]), int(row.get("draw", 0))), []).append(row)
    expected = {(s, d) for s in range(len(sets)) for d in range(draws)}
    if grouped.keys() != expected:
        raise AggregationError(
            f"{source(ev)}: its rows cover (set, draw) {sorted(grouped)}, its scores "
            f"{len(sets)} sets × {draws} draws"
        )
    by_uid = {where: {_uid(ev, r["uid"]): r for r in group} for where, group in grouped.items()}
    for (index, draw), found in by_uid.items():
        if len(found) != len(grouped[index, draw]) or found.keys() != set(sets[index]):
            raise AggregationError(
                f"{source(ev)}: the rows of test set {index}, draw {draw} are not the examples "
                "of that set"
            )
    return by_uid


def _rescored(text: str | None, gold: str) -> dict[str, int] | None:
    """A CoNLL output's tp/fp/fn against its gold, over the four fields."""
    if text is None:
        return None
    counts = entity_prf([output_fields(text)], [output_fields(gold)], FIELDS)["micro"]
    return {"tp": counts.tp, "fp": counts.fp, "fn": counts.fn}


def _row_counts(ev: Evaluation, row: dict[str, Any], selection: str) -> np.ndarray | None:
    """A row's statistics for a selection from its `selection_scores`, its `scores` (for the
    selection it predicts) or, in older CoNLL search files, the selection's text rescored:
    [tp, fp, fn], or for BLEU the statistics of its text ("" when invalid, as the task scores)."""
    item = (row.get("selection_scores") or {}).get(selection)
    if item is None and selection == ev.decoding:
        item = row.get("scores")
    if ev.metric == "bleu":
        if not isinstance(item, dict) or "valid" not in item:
            return None
        text = (row.get("selections") or {}).get(selection, row.get("prediction"))
        return bleu_statistics((text or "") if item["valid"] else "", row.get("gold", ""))
    if item is None and ev.task == "conll":
        item = _rescored((row.get("selections") or {}).get(selection), row.get("gold", ""))
    return item_counts(item) if isinstance(item, dict) else None


def set_counts(
    ev: Evaluation, rows: dict[str, dict[str, Any]], selection: str
) -> np.ndarray | None:
    """One set's per-example statistics in sorted-uid order where the metric is a function of
    their sum (`SUMMED_METRICS`; an error when a row lacks them), else None."""
    if ev.metric not in SUMMED_METRICS:
        return None
    counts = [_row_counts(ev, rows[uid], selection) for uid in sorted(rows)]
    missing = [uid for uid, c in zip(sorted(rows), counts) if c is None]
    if missing:
        raise AggregationError(
            f"{source(ev)}: {len(missing)} rows without per-example statistics for {selection} "
            f"(e.g. {missing[0]})"
        )
    return np.stack(counts)


def checked(
    ev: Evaluation, selection: str, where: str, counts: np.ndarray | None, expected: float
) -> float:
    """The score recomputed from the counts (the results' own where there are none); an error
    when the two disagree."""
    if counts is None:
        return expected
    score = float(set_score(counts.sum(0)))
    if abs(score - expected) > TOLERANCE:
        raise AggregationError(
            f"{source(ev)}: {selection} on {where}: {ev.metric} {score:.12f} from the predictions' "
            f"counts, {expected:.12f} in the results file"
        )
    return score
