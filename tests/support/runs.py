"""Run directories as sweeps leave them, and Markdown table parsing, for the aggregator tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from grammarrl.runs.results import build_results, write_results

CONLL_EMPTY = {"person": "", "organization": "", "location": "", "misc": ""}


def conll(**fields: str) -> str:
    return json.dumps({**CONLL_EMPTY, **fields})


def make_run(
    root: Path,
    name: str,
    *,
    task: str = "conll",
    model: str = "tiny",
    mode: str = "train",
    lam: float = 0.5,
    n: int = 3,
    b: int = 3,
    results: dict[str, list[float]] | None = None,
    decodings: dict[str, str] | None = None,
    predictions: dict[str, list[dict[str, Any]]] | None = None,
    metrics: str | None = None,
    choices: dict[str, str] | None = None,
    eps: float = 10.0,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """A job directory as a sweep leaves it: .hydra/ config and choices, results files written
    by grammarrl.runs.results (scores per test set), predictions, Lightning's metrics.csv."""
    path = root / name
    (path / ".hydra").mkdir(parents=True)
    config = {
        "mode": mode,
        "lambda": lam,
        "seed": 0,
        "task": {"name": task, "metric": "m"},
        "model": {"name": model},
        "rollout": {"num_samples": n, "beam_width": b},
        "eval": {"decoding": "greedy", "adapter": None, "beam_width": 3},
        "cache_dir": str(root / "cache"),
        **(extra_config or {}),
    }
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (path / ".hydra" / "hydra.yaml").write_text(
        yaml.safe_dump({"hydra": {"runtime": {"choices": choices or {}}}})
    )
    for stem, scores in (results or {}).items():
        decoding = (decodings or {}).get(stem, "beam" if stem.endswith("_beam") else "greedy")
        record = build_results(
            task=task,
            model=model,
            decoding=decoding,
            metric=f"{task}_metric",
            scores=scores,
            validity=1.0,
            truncated=0.0,
            examples_per_second=eps,
            config=config,
            beam_width=3 if decoding == "beam" else None,
        )
        rows = (predictions or {}).get(stem)
        write_results(path, record, rows, name=stem)
    if metrics is not None:
        (path / "metrics").mkdir()
        (path / "metrics" / "metrics.csv").write_text(metrics)
    return path


def read_results(path: Path, stem: str = "results") -> dict[str, Any]:
    return json.loads((path / f"{stem}.json").read_text())


def md_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows: label -> cells (bold markers removed)."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| **"):
            cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows
