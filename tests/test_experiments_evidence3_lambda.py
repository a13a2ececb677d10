"""Evidence III's λ reader (experiments/studies/evidence3_lambda.py) on hand-made runs: the
reference's outputs at steps 0 and 2 (each a folder's step-0 record), a run validating at
steps 2 and 4 on the same two dev inputs."""

from __future__ import annotations

import pytest

from experiments.runs import AggregationError
from experiments.studies import evidence3_lambda as lam
from tests.support.evidence3 import GOLDS, RIGHT, conll, write_run

WRONG_A = {"tp": 0, "fp": 1, "fn": 1}  # a: its person missed, a location invented
METRICS = "step,train/kl,train/reward_direct\n0,0.5,-1.0\n3,1.5,-3.0\n"


@pytest.fixture
def reference(tmp_path):
    # step 0 (frozen): F1 2/4; step 2: both right, F1 1
    frozen = [(0, "a", conll(location="Rome"), WRONG_A), (0, "b", conll(location="Oslo"), RIGHT)]
    trained = [(0, "a", conll(person="Ann"), RIGHT), (0, "b", conll(location="Oslo"), RIGHT)]
    return {
        0: write_run(tmp_path / "frozen", frozen, METRICS),
        2: write_run(tmp_path / "adapter-2", trained, METRICS),
    }


@pytest.fixture
def run(tmp_path):
    # step 2: a fills both fields (person right, location invented), b right: P 2/3, R 2/2
    # step 4: a right, b empty: P 1/1, R 1/2
    return write_run(
        tmp_path / "run",
        [
            (2, "a", conll(person="Ann", location="Rome"), {"tp": 1, "fp": 1, "fn": 0}),
            (2, "b", conll(location="Oslo"), RIGHT),
            (4, "a", conll(person="Ann"), RIGHT),
            (4, "b", conll(), {"tp": 0, "fp": 0, "fn": 1}),
        ],
        METRICS,
    )


def test_each_validation_is_read_against_step_0_and_the_reference_at_its_step(run, reference):
    rows = lam.comparison_rows(run, "λ=0.25", GOLDS, reference)
    assert [(r["run"], r["step"]) for r in rows] == [
        ("step 0", 0),
        ("λ=0.75", 2),
        ("λ=0.25", 2),
        ("λ=0.25", 4),
    ]
    start, ref2, at2, at4 = rows
    assert start["dev_micro_f1"] == pytest.approx(0.5) and ref2["dev_micro_f1"] == 1.0
    assert "vs_step_0" not in ref2  # the reference's own rows carry no differences
    assert at2["dev_micro_f1"] == pytest.approx(0.8)  # 2 tp, 1 fp, 0 fn
    assert at2["vs_step_0"][0] == pytest.approx(0.3)
    assert at2["vs_reference"][0] == pytest.approx(-0.2)
    assert at2["entities_per_output"] == 1.5
    assert at2["fields"]["location"] == {"precision": 0.5, "recall": 1.0}
    assert at4["dev_micro_f1"] == pytest.approx(2 / 3) and at4["vs_reference"] is None
    table = lam.markdown(rows)
    assert "| λ=0.25 | 2 | 0.800 | +0.300 [" in table and "| λ=0.25 | 4 | 0.667 |" in table


def test_reference_outputs_without_step_0_are_refused(run, reference, tmp_path):
    with pytest.raises(AggregationError, match="step 0"):
        lam.comparison_rows(run, "λ=0.25", GOLDS, {2: reference[2]})
    with pytest.raises(AggregationError, match="no dev record at step 0"):
        lam.comparison_rows(run, "λ=0.25", GOLDS, {0: run})


def test_the_figure_draws_dev_curves_from_the_rows(run, reference, tmp_path):
    rows = lam.comparison_rows(run, "λ=0.25", GOLDS, reference)
    series = lam.figure_series(rows, {"λ=0.75": reference[0], "λ=0.25": run})
    assert series["λ=0.25"]["dev/micro_f1"] == [(0, 0.5), (2, 0.8), (4, pytest.approx(2 / 3))]
    assert series["λ=0.75"]["dev/entities_per_output"] == [(0, 1.0), (2, 1.0)]
    assert series["λ=0.25"]["train/kl"] == [(0, 0.5), (3, 1.5)]
    path = lam.training_curves(series, "micro_f1", tmp_path / "lambda.png", lam.PANELS)
    assert path is not None and path.stat().st_size > 0
