"""Statistics computed from the runs' files: predictions (CoNLL empty fields, gloss trap
tokens), logged training metrics (curves) and calibration entries (σ's)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments.runs import AggregationError, Evaluation, Run, read_jsonl
from grammarrl.evaluation import curves
from grammarrl.rl.calibration import calibration_key, entries
from grammarrl.runs.results import mean_std
from grammarrl.tasks import conll


def read_predictions(ev: Evaluation) -> list[dict[str, Any]]:
    """The evaluation's predictions file, one dict per (test set, example)."""
    path = ev.predictions
    if not path.is_file():
        raise AggregationError(f"{path}: predictions file missing for {ev.run.path / ev.name}.json")
    return read_jsonl(path)


def per_set_mean(
    rows: Sequence[dict[str, Any]], statistic: Callable[[list[dict[str, Any]]], float]
) -> tuple[float, float]:
    """(mean, std) over test sets (the `set` field) of a statistic of each set's rows."""
    sets: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sets[int(row.get("set", 0))].append(row)
    return mean_std([statistic(sets[k]) for k in sorted(sets)])


def empty_field_rate(rows: Sequence[dict[str, Any]]) -> float:
    """Percentage of gold non-empty CoNLL fields left empty in a set's predictions."""
    return conll.empty_field_rate([r["prediction"] for r in rows], [r["gold"] for r in rows])


def term_count(term: str) -> Callable[[list[dict[str, Any]]], float]:
    """Occurrences of one gloss term in a set's predictions (terms are space-separated)."""
    return lambda rows: float(sum(row["prediction"].split().count(term) for row in rows))


def read_metrics(run: Run) -> dict[str, list[tuple[int, float]]]:
    """Lightning's CSV metrics of a training run: column -> [(step, value)]
    (`grammarrl.evaluation.curves.read_metrics`)."""
    return curves.read_metrics(run.path)


def calibration_entry(run: Run) -> dict[str, Any] | None:
    """σ's of a mode=calibrate run: from `<run>/calibration.json` when the run wrote one, else
    the entry measured in this run in its shared calibration file (`reward.calibration_file`,
    by default cache_dir/calibration.json) under its task/model/nN_bB key; None when neither
    holds it (the run failed)."""
    key = calibration_key(
        run.get("task.name"),
        run.get("model.name"),
        run.get("rollout.num_samples"),
        run.get("rollout.beam_width"),
    )
    shared = run.get("reward.calibration_file") or Path(str(run.get("cache_dir", ""))) / (
        "calibration.json"
    )
    own = run.path / "calibration.json"
    if own.is_file():
        table = json.loads(own.read_text())
        found = [table] if "sigma_direct" in table else entries(table, key)
        source = own
    else:
        source = Path(shared)
        stored = entries(json.loads(source.read_text()), key) if source.is_file() else []
        found = [e for e in stored if e.get("measured_in", str(run.path)) == str(run.path)]
    if not found:
        return None
    return {  # the run's names win over the stored entry's conditions (its `model` is a dict)
        **found[-1],
        "task": run.get("task.name"),
        "model": run.get("model.name"),
        "n": run.get("rollout.num_samples"),
        "b": run.get("rollout.beam_width"),
        "source": str(source),
    }
