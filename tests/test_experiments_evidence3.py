"""Evidence III's pilot reader (experiments/studies/evidence3.py) on a hand-made run: two
validations of two dev inputs, the steps between them logged in metrics.csv."""

from __future__ import annotations

import json

import pytest

from experiments.runs import AggregationError
from experiments.studies import evidence3
from tests.support.evidence3 import GOLDS, RIGHT, conll, write_run


@pytest.fixture
def run(tmp_path):
    # step 0: a misses its person (fn) and invents a location (fp); b right (tp). F1 = 2/4
    # step 2: both right. F1 = 1
    rows = [
        (0, "a", conll(location="Rome"), {"tp": 0, "fp": 1, "fn": 1}),
        (0, "b", conll(location="Oslo"), {"tp": 1, "fp": 0, "fn": 0}),
        (2, "a", conll(person="Ann"), {"tp": 1, "fp": 0, "fn": 0}),
        (2, "b", conll(location="Oslo"), {"tp": 1, "fp": 0, "fn": 0}),
    ]
    lines = [
        json.dumps({"step": s, "slice": "dev", "uid": u, "prediction": p, "scores": c})
        for s, u, p, c in rows
    ]
    (tmp_path / "validation.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "metrics.csv").write_text(
        "step,train/ess,train/no_targets,perf/step_seconds,train/forward_passes\n"
        "0,1.0,0.5,10,50\n"
        "1,3.0,0.0,20,110\n"
    )
    return tmp_path


def test_pilot_rows_read_each_validation_against_step_0(run):
    first, second = evidence3.pilot_rows(run, GOLDS)
    assert (first["step"], second["step"]) == (0, 2)
    assert first["dev_micro_f1"] == pytest.approx(0.5) and second["dev_micro_f1"] == 1.0
    assert first["difference"] is None
    observed, low, high, _ = second["difference"]
    assert observed == pytest.approx(0.5) and low <= observed <= high
    assert second["ESS"] == 2.0 and second["no targets"] == 0.25 and second["s / step"] == 15
    assert second["forward_passes"] == 110  # cumulative after the last step before it
    assert first["fields"]["location"] == {"precision": 0.5, "recall": 1.0}
    assert second["fields"]["person"] == {"precision": 1.0, "recall": 1.0}
    assert first["entities_per_output"] == 1.0
    table = evidence3.markdown([first, second])
    assert "| 2 | 1.000 | +0.500 [" in table


def test_step_0_and_a_rival_can_come_from_other_folders(run, tmp_path):
    # the start: both right (F1 1); the rival: b empty, a right (F1 2/3); the run at step 2: F1 1
    start = write_run(
        tmp_path / "start",
        [(0, "a", conll(person="Ann"), RIGHT), (0, "b", conll(location="Oslo"), RIGHT)],
        "step\n",
    )
    rival = write_run(
        tmp_path / "rival",
        [(0, "a", conll(person="Ann"), RIGHT), (0, "b", conll(), {"tp": 0, "fp": 0, "fn": 1})],
        "step\n",
    )
    first, second = evidence3.pilot_rows(run, GOLDS, start=start, rival=rival)
    assert first["dev_micro_f1"] == 1.0 and first["vs_rival"] is None
    assert second["difference"][0] == pytest.approx(0.0)  # against the start, not the run's 0
    assert second["vs_rival"][0] == pytest.approx(1 / 3)
    assert second["ESS"] == 2.0  # the run's own training log
    table = evidence3.markdown([first, second], "RLOO")
    assert "Δ vs RLOO [95%]" in table and "| 2 | 1.000 | +0.000 [" in table
    assert "+0.333 [" in table
    with pytest.raises(AggregationError, match="no dev record at step 0"):
        evidence3.pilot_rows(run, GOLDS, start=tmp_path / "none")
