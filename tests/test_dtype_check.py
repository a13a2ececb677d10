"""experiments/dtype_check.py: a system decoded again in another dtype against its recorded run,
on the committed CoNLL check (greedy in float32 against the study's bfloat16 runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from experiments.dtype_check import dtype_checks
from experiments.runs import AggregationError, read_jsonl

FOLDER = Path(__file__).resolve().parents[1] / "experiments" / "results" / "frontier"


def _predictions(folder: Path) -> dict[tuple[int, str], str]:
    path = folder / "predictions.jsonl"
    rows = read_jsonl(path if path.is_file() else folder / "predictions.jsonl.gz")
    return {(r["set"], r["uid"]): r["prediction"] for r in rows}


def test_each_check_is_paired_with_its_recorded_run_and_counts_the_outputs_that_differ():
    checks = dtype_checks(FOLDER / "dtype_check", FOLDER / "runs")
    assert [(c["task"], c["system"]) for c in checks] == [
        ("conll", "frozen_greedy"),
        ("conll", "trained_greedy"),
    ]
    for c in checks:
        assert (c["dtype"], c["recorded_dtype"]) == ("float32", "bfloat16")
        observed, low, high = c["difference"]
        assert observed == pytest.approx(c["score"] - c["recorded_score"], abs=1e-9)
        assert low < observed < high
        mine = _predictions(FOLDER / "dtype_check" / "conll" / f"{c['system']}_fp32")
        theirs = _predictions(FOLDER / "runs" / "conll" / c["system"])
        assert c["examples"] == len(mine) == 300
        assert c["outputs_differ"] == sum(mine[k] != theirs[k] for k in mine) > 0


def test_a_check_without_its_recorded_run_is_an_error_naming_it(tmp_path):
    shutil.copytree(
        FOLDER / "dtype_check" / "conll" / "frozen_greedy_fp32",
        tmp_path / "checks" / "conll" / "beam3_fp32",
    )
    (tmp_path / "runs" / "conll").mkdir(parents=True)
    with pytest.raises(AggregationError, match="beam3_fp32: no recorded run"):
        dtype_checks(tmp_path / "checks", tmp_path / "runs")
