"""The experiments' building blocks on hand-worked inputs: paired differences and bootstrap,
dev records and their intervals, curves, and what outputs hold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import curves, dev_selection, outputs, paired, systems
from experiments.runs import AggregationError
from grammarrl.tasks.conll import FIELDS, output_fields


def test_differences_are_per_set_and_signed():
    assert paired.differences([0.5, 0.25, 0.0], [0.25, 0.5, 0.0]) == [0.25, -0.25, 0.0]


def test_counts_by_set_keys_examples_by_set_and_uid():
    rows = [
        {"set": 0, "uid": "a", "scores": {"tp": 1, "fp": 2, "fn": 3}},
        {"set": 1, "uid": "a", "scores": {"tp": 0, "fp": 0, "fn": 1}},
    ]
    found = paired.counts_by_set(rows)
    assert found[0]["a"].tolist() == [1, 2, 3] and found[1]["a"].tolist() == [0, 0, 1]


def test_the_examples_interval_ignores_whether_draws_are_resampled():
    """With one draw per set, resampling the draws changes nothing but the rng stream: the
    observed difference is the mean per-set micro-F1 difference either way."""
    a = np.array([[[2, 0, 0], [0, 1, 1]]])  # F1 of summed [2, 1, 1]: 4/6
    b = np.array([[[1, 1, 0], [0, 0, 2]]])  # F1 of summed [1, 1, 2]: 2/5
    pairs = [(a, b), (b, b)]
    only = paired.paired_bootstrap(pairs, resamples=200, draws=False)
    both = paired.paired_bootstrap(pairs, resamples=200)
    assert only.keys() == {"examples"}
    assert only["examples"]["observed"] == pytest.approx((4 / 6 - 2 / 5) / 2)
    assert both["examples_and_draws"]["observed"] == only["examples"]["observed"]
    assert only["examples"]["low"] <= only["examples"]["observed"] <= only["examples"]["high"]


def write_validation(run: Path, step_items: dict[int, list[dict[str, int]]]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": step, "slice": "dev", "uid": str(i), "scores": item}
        for step, items in step_items.items()
        for i, item in enumerate(items)
    ]
    rows.append({"step": 0, "slice": "train", "uid": "t", "scores": {"tp": 9, "fp": 0, "fn": 0}})
    (run / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


HIT, MISS = {"tp": 1, "fp": 0, "fn": 0}, {"tp": 0, "fp": 1, "fn": 1}


def test_dev_rows_default_to_the_last_validation(tmp_path: Path):
    write_validation(tmp_path / "run", {0: [MISS] * 3, 10: [HIT, MISS, HIT]})
    assert [r["scores"] for r in dev_selection.dev_rows(tmp_path / "run")] == [HIT, MISS, HIT]
    assert len(dev_selection.dev_rows(tmp_path / "run", step=0)) == 3
    assert dev_selection.dev_rows(tmp_path / "none") == []
    low, high, size = dev_selection.dev_interval(tmp_path / "run")
    assert size == 3 and low <= 0.8 <= high  # F1 of [2, 1, 1]: 4/5


def test_paired_dev_interval_against_a_reference_run(tmp_path: Path):
    write_validation(tmp_path / "new", {20: [HIT, HIT, MISS, HIT]})  # [3, 1, 1]: F1 6/8
    write_validation(tmp_path / "ref", {40: [HIT, MISS, MISS, MISS]})  # [1, 3, 3]: F1 2/8
    observed, low, high, above = dev_selection.paired_dev_interval(
        tmp_path / "new", tmp_path / "ref"
    )
    assert observed == pytest.approx(0.5) and low <= observed <= high and above > 0.5
    flipped = dev_selection.paired_dev_interval(tmp_path / "ref", tmp_path / "new")
    assert flipped[0] == pytest.approx(-0.5)
    write_validation(tmp_path / "pilot", {0: [HIT, MISS, MISS, MISS], 20: [HIT, HIT, MISS, HIT]})
    from_start = dev_selection.paired_dev_interval(
        tmp_path / "pilot", tmp_path / "pilot", reference_step=0
    )
    assert from_start[0] == pytest.approx(0.5)  # a run against its own step 0
    write_validation(tmp_path / "short", {20: [HIT, HIT, MISS]})
    with pytest.raises(AggregationError, match="different examples"):
        dev_selection.paired_dev_interval(tmp_path / "short", tmp_path / "ref")
    with pytest.raises(AggregationError, match="no per-example dev record"):
        dev_selection.paired_dev_interval(tmp_path / "new", tmp_path / "none")


def test_curves_keep_the_last_value_of_a_step_and_average_trailing_windows():
    series = {"train/kl": [(2, 4.0), (1, 1.0), (2, 3.0), (3, 5.0)]}
    assert curves.curve(series, "train/kl") == [(1, 1.0), (2, 3.0), (3, 5.0)]
    points = curves.curve(series, "train/kl")
    assert curves.moving_average(points, window=2) == [(1, 1.0), (2, 2.0), (3, 4.0)]
    assert curves.last_mean(series, "train/kl", 2) == 4.0
    assert curves.last_mean(series, "train/reward", 2) is None


def conll_row(index: int, gold: dict[str, str], prediction: dict[str, str], tokens: int) -> dict:
    return {
        "set": 0,
        "uid": f"u{index}",
        "gold": json.dumps(gold),
        "prediction": json.dumps(prediction),
        "num_tokens": tokens,
    }


def test_field_statistics_give_per_field_precision_recall_and_length():
    empty = dict.fromkeys(FIELDS, "")
    rows = [
        conll_row(0, empty | {"person": "Ann"}, empty | {"person": "Ann", "misc": "X"}, 20),
        conll_row(1, empty | {"location": "Rome"}, empty | {"person": "Bob"}, 30),
    ]
    found = outputs.field_statistics(rows, FIELDS, output_fields)
    assert found["person"] == {"precision": 0.5, "recall": 1.0}
    assert found["location"] == {"precision": 0.0, "recall": 0.0}
    assert found["misc"]["precision"] == 0.0
    assert found["micro"] == {"precision": 1 / 3, "recall": 0.5}
    assert found["length"] == {"tokens": 25.0}
    records = [{"uid": r["uid"], "prediction": r["prediction"]} for r in rows]  # validation.jsonl
    golds = {r["uid"]: r["gold"] for r in rows}
    by_uid = outputs.field_statistics(records, FIELDS, output_fields, gold=golds)
    assert by_uid["person"] == found["person"] and "length" not in by_uid
    with pytest.raises(AggregationError, match="example u1: no gold"):
        outputs.field_statistics(records, FIELDS, output_fields, gold={"u0": rows[0]["gold"]})


def test_agreement_and_set_statistics_per_test_set():
    rows = [
        {"set": 0, "uid": "a", "prediction": "x", "scores": {"tp": 1, "fp": 1, "fn": 0}},
        {"set": 0, "uid": "b", "prediction": "y", "scores": {"tp": 0, "fp": 0, "fn": 2}},
        {"set": 1, "uid": "a", "prediction": "z", "scores": {"tp": 1, "fp": 0, "fn": 0}},
    ]
    other = [dict(r, prediction="x") for r in rows]
    assert outputs.agreement(rows, other) == [0.5, 0.0]
    stats = outputs.set_statistics(rows[:2])
    assert stats == {"precision": 0.5, "recall": 1 / 3, "predicted": 1.0, "gold": 1.5}


def test_comparison_table_pairs_each_row_with_each_reference_and_pads_missing_rows():
    greedy = systems.System("frozen greedy", None, (0.2, 0.4))
    rerank = systems.System("rerank", None, (0.3, 0.3))
    trained = systems.System("trained", None, (0.5, 0.2))
    missing = systems.System("missing run", None)
    table = systems.comparison_table([greedy, rerank, trained, missing], [greedy, rerank], "c")
    assert table.header[3:6:2] == ["diff. vs frozen greedy", "diff. vs rerank"]
    found = {row.label: [c.render(3) for c in row.cells] for row in table.rows()}
    assert found["trained"][2:] == [
        "0.050 ± 0.354",  # std (ddof=1) of +0.3, -0.2: 0.5 / sqrt(2)
        "+0.300, -0.200",
        "0.050 ± 0.212",
        "+0.200, -0.100",
    ]
    assert found["missing run"] == ["missing"] + ["–"] * 5
    assert all(len(cells) == len(table.header) - 1 for cells in found.values())
