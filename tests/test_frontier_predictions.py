"""The frontier study's predictions file (experiments/frontier_predictions.py): what the seeds'
diagnoses agree on, the λ the study trains at, and the file regenerated from its records."""

from __future__ import annotations

import json

import pytest
import yaml

from experiments.frontier_predictions import (
    NONE,
    consensus,
    field_consensus,
    predictions,
    render,
    task_prediction,
)
from experiments.frontier_sets import frontier_rows, line_key
from grammarrl.tasks import load_task
from tests.conftest import REPO, compose_config
from tests.test_custom_task import load_make_data


def seed(outlook="likely", reranking=0.25, training=0.5, blind=(), undecided=()) -> dict:
    return {
        "seed": 0,
        "outlook": outlook,
        "reranking_lambda": reranking,
        "training_lambda": NONE if training is None else training,
        "greedy": 0.2,
        "lift": 0.1,
        "lift_interval": [0.01, 0.2],
        "blind": list(blind),
        "undecided": list(undecided),
        "seen": [],
        "seconds": 300,
    }


def test_consensus_needs_more_than_half_of_the_seeds():
    assert consensus(["likely", "likely", "unlikely"]) == "likely"
    assert consensus(["likely", "unlikely", "unmeasured"]) == "split"
    assert consensus([0.5]) == 0.5
    assert field_consensus([["misc"], ["misc", "person"], []]) == ["misc"]
    assert field_consensus([["a"], ["b"], ["c"]]) == []


def test_the_study_trains_at_the_agreed_training_lambda_or_says_training_empties():
    agreed = task_prediction([seed(training=0.5), seed(training=0.5), seed(training=0.75)])
    assert (agreed["train_at"], agreed["empties"]) == (0.5, False)
    empties = task_prediction([seed(reranking=0.25, training=None)] * 2 + [seed(training=1.0)])
    assert (empties["train_at"], empties["empties"]) == (0.25, True)
    split = task_prediction(
        [
            seed(reranking=1.0, training=1.0),
            seed(reranking=0.0, training=0.0),
            seed(reranking=0.5, training=0.5),
        ]
    )
    assert split["training_lambda"] == "split" and split["train_at"] == 0.5


def diagnosis(seed_: int, outlook: str, training: float | None, blind: list[str]) -> dict:
    return {
        "settings": {"seed": seed_},
        "verdict": {
            "outlook": outlook,
            "reranking_lambda": 0.25,
            "training_lambda": training,
            "blind": blind,
            "undecided": [],
            "seen": ["person"],
        },
        "candidates": {
            "greedy": {"value": 0.2},
            "crossfit": {"lift": 0.08, "interval": [0.01, 0.15]},
        },
        "seconds": {"candidates": 200.4, "perturbations": 60.2},
    }


def test_the_file_is_written_from_the_plan_and_the_records(tmp_path):
    plan = {
        "sampler_seeds": [0, 1, 2],
        "preamble": "# Predictions\n",
        "rules": "## Rules\n",
        "tasks": {"conll": {"diagnose": "task=conll", "test": "seed 3", "training": "360 steps"}},
    }
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    verdicts = [("likely", 0.75, ["misc"]), ("likely", None, ["misc"]), ("unlikely", 0.75, [])]
    for s, (outlook, training, blind) in enumerate(verdicts):
        folder = tmp_path / "diagnosis" / f"conll_s{s}"
        folder.mkdir(parents=True)
        (folder / "diagnosis.json").write_text(json.dumps(diagnosis(s, outlook, training, blind)))
    data = predictions(tmp_path)
    text = render(data)
    assert "| conll | likely | 0.75 | no | `misc` | none |" in text
    assert (
        "| conll | likely / likely / unlikely | 0.25 / 0.25 / 0.25 | 0.75 / none / 0.75 |" in text
    )
    assert "+0.080 [+0.010, +0.150]" in text and "| 261 / 261 / 261 |" in text
    assert text.startswith("# Predictions") and "## Rules" in text


@pytest.mark.slow
def test_the_persons_test_file_holds_the_conll_draws_sentences_in_order(real_data_dir, tmp_path):
    """experiments/frontier_sets.py: the persons rows of CoNLL's seed-3 draw, one per sentence,
    in the draw's order; a missing sentence is an error naming make_data.py."""
    data = [f"data.dir={real_data_dir}", f"cache_dir={tmp_path}"]
    load_make_data(REPO / "examples" / "conll_persons").main(data)
    rows, folder = frontier_rows(3, data)
    draw = load_task(compose_config(["task=conll", *data])).test_sets(3, 100, 3)
    assert [line_key(r["source"]) for r in rows] == [line_key(e.uid) for s in draw for e in s]
    assert len({r["sentence"] for r in rows}) > 290 and any(r["output"]["persons"] for r in rows)
    test = folder / "test.jsonl"
    first = line_key(rows[0]["source"])
    kept = [r for r in test.read_text().splitlines(keepends=True) if first not in r]
    test.write_text("".join(kept))
    with pytest.raises(SystemExit, match="make_data.py"):
        frontier_rows(3, data)
    test.unlink()
    with pytest.raises(SystemExit, match="does not exist; run examples/conll_persons/make_data"):
        frontier_rows(3, data)


def test_the_committed_predictions_file_is_what_its_records_give():
    """experiments/results/frontier-predictions.md (and .json) regenerate byte for byte from the
    plan and the 21 committed diagnosis records: nothing in them was typed by hand."""
    folder = REPO / "experiments" / "results"
    data = predictions(folder / "frontier")
    assert len(data["tasks"]) == 7 and all(len(t["seeds"]) == 3 for t in data["tasks"].values())
    assert render(data) == (folder / "frontier-predictions.md").read_text()
    committed = json.loads((folder / "frontier-predictions.json").read_text())
    assert json.loads(json.dumps(data)) == committed
