"""Evidence IV's pilot reader (experiments/studies/evidence4.py) on hand-made runs: the λ=0.75
reference's outputs at steps 0 and 2 (its "360-step adapter" here at step 2), two routes
validating at step 2 on the same two dev inputs."""

from __future__ import annotations

import pytest

from experiments.runs import AggregationError
from experiments.studies import evidence4 as e4
from tests.support.evidence3 import GOLDS, RIGHT, conll, write_run

METRICS = "step,train/kl\n0,0.5\n"
MISSED = {"tp": 0, "fp": 0, "fn": 1}


@pytest.fixture
def reference(tmp_path):
    # step 0 (frozen): a empty, b right (F1 2/3, empty 50%); step 2: a right, b empty
    frozen = [(0, "a", conll(), MISSED), (0, "b", conll(location="Oslo"), RIGHT)]
    adapter = [(0, "a", conll(person="Ann"), RIGHT), (0, "b", conll(), MISSED)]
    return {
        0: write_run(tmp_path / "frozen", frozen, METRICS),
        2: write_run(tmp_path / "adapter", adapter, METRICS),
    }


@pytest.fixture
def sweep(tmp_path):
    both_right = [(2, "a", conll(person="Ann"), RIGHT), (2, "b", conll(location="Oslo"), RIGHT)]
    emptied = [(2, "a", conll(), MISSED), (2, "b", conll(), MISSED)]
    write_run(tmp_path / "pilot" / "1_emptied", emptied, METRICS)
    write_run(tmp_path / "pilot" / "0_balanced", both_right, METRICS)
    return tmp_path / "pilot"


def test_each_route_is_read_against_the_reference_its_adapter_and_step_0(
    sweep, reference, monkeypatch
):
    monkeypatch.setattr(e4, "ADAPTER_360", 2)
    routes = e4.route_dirs(sweep)
    assert list(routes) == ["balanced", "emptied"]  # in job order
    rows = e4.pilot_rows(routes, GOLDS, reference)
    assert [(r["run"], r["step"]) for r in rows] == [
        ("step 0", 0),
        ("λ=0.75", 2),
        ("balanced", 2),
        ("emptied", 2),
    ]  # the reference's rows once
    start, adapter, balanced, emptied = rows
    assert start[e4.EMPTY] == 50.0 and adapter[e4.EMPTY] == 50.0
    assert balanced[e4.EMPTY] == 0.0 and emptied[e4.EMPTY] == 100.0
    assert balanced["vs_adapter_360"][0] == pytest.approx(1 - 2 / 3)
    assert emptied["entities_per_output"] == 0 and emptied["dev_micro_f1"] == 0
    text = e4.markdown(rows, list(routes))
    assert "| emptied | 2 | 0.000 |" in text and "empty-field %" in text


def test_the_rule_sends_a_route_to_test_only_with_an_interval_above_zero():
    def row(label, adapter, reference):
        return {"run": label, "vs_adapter_360": adapter, "vs_reference": reference}

    above, straddles = (0.1, 0.02, 0.2, 1.0), (0.1, -0.01, 0.2, 0.9)
    rows = [
        row("a", straddles, above),  # beats λ=0.75 at its step
        row("b", straddles, straddles),
        row("c", above, None),  # beats the adapter; no reference at its step
    ]
    assert [e4.goes_to_test(rows, x) for x in "abc"] == [True, False, True]


def test_a_sweep_without_route_jobs_and_a_reference_without_its_adapter_are_refused(
    tmp_path, reference
):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AggregationError, match="no job folders"):
        e4.route_dirs(tmp_path / "empty")
    with pytest.raises(AggregationError, match="need step 360"):
        e4.pilot_rows({}, GOLDS, reference)
