"""Evidence III's ablation reader (experiments/studies/evidence3_ablation.py) on a hand-made
sweep: the reference validates at steps 0 and 2, a variant at step 2 only, on the same two dev
inputs."""

from __future__ import annotations

import pytest

from experiments.runs import AggregationError
from experiments.studies import evidence3_ablation as ablation
from tests.support.evidence3 import GOLDS, RIGHT, conll, write_run


@pytest.fixture
def sweep(tmp_path):
    # reference: step 0 F1 2/4 (a: location invented, person missed; b right), step 2 both right
    write_run(
        tmp_path / "0_kl_reward",
        [
            (0, "a", conll(location="Rome"), {"tp": 0, "fp": 1, "fn": 1}),
            (0, "b", conll(location="Oslo"), RIGHT),
            (2, "a", conll(person="Ann"), RIGHT),
            (2, "b", conll(location="Oslo"), RIGHT),
        ],
        "step,train/kl,train/reward_direct,train/log_valid_mass,train/candidate_tokens,"
        "val/dev_reward_direct,val/dev_trained_steps\n"
        "0,,,,,-1.5,0\n0,0.2,-1.0,-4,20,,\n1,0.4,-2.0,,,,\n1,,,,,-0.5,2\n",
    )
    # no_kl at step 2: a fills both fields (person right, location invented), b empty: F1 2/4
    write_run(
        tmp_path / "1_no_kl",
        [
            (2, "a", conll(person="Ann", location="Rome"), {"tp": 1, "fp": 1, "fn": 0}),
            (2, "b", conll(), {"tp": 0, "fp": 0, "fn": 1}),
        ],
        "step,train/kl,val/dev_trained_steps\n0,1.0,\n1,3.0,\n1,,2\n",
    )
    (tmp_path / "2_kl_loss").mkdir()  # a job that has not validated yet: left out
    return tmp_path


def test_rows_read_each_variant_against_step_0_and_the_reference(sweep):
    runs = ablation.variant_runs(sweep)
    assert list(runs) == ["kl_reward", "no_kl"]
    start, reference, variant = ablation.ablation_rows(runs, GOLDS)
    assert (start["step"], start["dev_micro_f1"]) == (0, pytest.approx(0.5))
    assert start["gold_entities_per_output"] == 1.0 and start["dev R_direct"] == -1.5
    assert reference["vs_reference"] is None and reference["dev_micro_f1"] == 1.0
    assert reference["vs_step_0"][0] == pytest.approx(0.5)
    assert reference["KL"] == pytest.approx(0.3) and reference["R_direct"] == -1.5
    assert reference["dev R_direct"] == -0.5
    assert variant["dev_micro_f1"] == pytest.approx(0.5)
    assert variant["vs_step_0"][0] == pytest.approx(0.0)
    assert variant["vs_reference"][0] == pytest.approx(-0.5)
    assert variant["KL"] == 2.0 and variant["R_direct"] is None
    assert variant["entities_per_output"] == 1.0
    assert variant["fields"]["location"] == {"precision": 0.0, "recall": 0.0}
    table = ablation.markdown([start, reference, variant])
    assert "| no_kl | 2 | 0.500 | +0.000 [" in table
    assert "Gold: 1.00 entities per output" in table


def test_a_sweep_without_the_reference_is_refused(sweep):
    (sweep / "0_kl_reward" / "validation.jsonl").unlink()
    with pytest.raises(AggregationError, match="kl_reward"):
        ablation.variant_runs(sweep)


def test_every_variant_s_curves_start_at_the_reference_step_0(sweep, tmp_path):
    runs = ablation.variant_runs(sweep)
    series = ablation.curve_series(runs)
    assert series["no_kl"]["val/dev_reward_direct"] == [(0, -1.5)]
    assert series["no_kl"]["train/kl"] == [(0, 1.0), (1, 3.0)]  # its own training curves
    path = ablation.curves_figure(runs, tmp_path / "curves.png")
    assert path is not None and path.stat().st_size > 0


def test_a_long_run_is_read_in_stretches(sweep):
    first, second = ablation.stretch_rows(sweep / "0_kl_reward", every=1)
    assert (first["step"], second["step"]) == ("0–0", "1–1")
    assert first["KL"] == pytest.approx(0.2) and second["KL"] == pytest.approx(0.4)
    assert first["log mass / token"] == pytest.approx(-0.2)
    assert second["log mass on grammar"] is None and second["log mass / token"] is None
    assert "| 0–0 | 0.20 |" in ablation.stretch_table([first, second])


def test_step_0_can_come_from_another_run(sweep, tmp_path):
    # a continuation: step 0 is another run's (here both outputs right: F1 1)
    start = write_run(
        tmp_path / "pilot",
        [(0, "a", conll(person="Ann"), RIGHT), (0, "b", conll(location="Oslo"), RIGHT)],
        "step,val/dev_reward_direct,val/dev_trained_steps\n0,-0.25,0\n",
    )
    runs = ablation.variant_runs(sweep)
    first, _, variant = ablation.ablation_rows(runs, GOLDS, start)
    assert first["dev_micro_f1"] == 1.0 and first["dev R_direct"] == -0.25
    assert variant["vs_step_0"][0] == pytest.approx(-0.5)  # 0.5 against the start's 1.0
    assert ablation.curve_series(runs, start)["kl_reward"]["val/dev_reward_direct"][0] == (0, -0.25)
    with pytest.raises(AggregationError, match="no dev record at step 0"):
        ablation.ablation_rows(runs, GOLDS, sweep / "1_no_kl")
