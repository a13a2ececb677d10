"""Hand-made CoNLL dev records for Evidence III's readers: two dev inputs, `a` (a person) and
`b` (a location), and runs that validated on them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def conll(person: str = "", location: str = "") -> str:
    """A CoNLL output (or gold) with at most a person and a location."""
    return json.dumps({"person": person, "organization": "", "location": location, "misc": ""})


GOLDS = {"a": conll(person="Ann"), "b": conll(location="Oslo")}
RIGHT = {"tp": 1, "fp": 0, "fn": 0}


def write_run(path: Path, rows: Iterable[tuple[int, str, str, dict]], metrics: str) -> Path:
    """A run folder: `validation.jsonl` from (step, uid, prediction, counts) rows and
    `metrics/metrics.csv` from its text."""
    path.mkdir(parents=True)
    lines = [
        json.dumps({"step": s, "slice": "dev", "uid": u, "prediction": p, "scores": c})
        for s, u, p, c in rows
    ]
    (path / "validation.jsonl").write_text("\n".join(lines) + "\n")
    (path / "metrics").mkdir()
    (path / "metrics" / "metrics.csv").write_text(metrics)
    return path
