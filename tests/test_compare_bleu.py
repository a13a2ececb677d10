"""Corpus BLEU in comparisons: a set's BLEU is recomputed from per-example statistics read from
the outputs' text (an invalid output counting as "", as the task scores it), checked against the
results file, and resampled by the paired bootstrap like micro-F1's counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from experiments import aggregate as agg
from experiments.intervals import bleu_statistics, set_score
from grammarrl.runs.results import build_results
from grammarrl.tasks.metrics import corpus_bleu

GOLD = [
    "IT-X BE BIT TOO-DESC LATE-DESC TO BE ASK FOR TRANSPARENCY NOW-DESC",
    "DESC-THANK YOU , MR PRESIDENT .",
    "X-I WANT TO SAY SOMETHING ABOUT THIS REPORT .",
    "WE ALSO NEED TO LOOK AT HOW WE CAN GO FORWARD",
    "THIS BE NOT ACCEPTABLE",
    "X-IT BE VERY IMPORTANT THAT WE ACT NOW",
]
GOOD = [
    "IT-X BE BIT TOO-DESC LATE-DESC TO ASK FOR TRANSPARENCY",
    "DESC-THANK YOU , MR PRESIDENT .",
    "X-I WANT TO SAY SOMETHING ABOUT REPORT .",
    "WE NEED TO LOOK AT HOW WE GO FORWARD",
    "THIS BE ACCEPTABLE",
    "X-IT BE IMPORTANT THAT WE ACT",
]
POOR = ["BE", "YOU", "X-I WANT", "WE NEED", "THIS", "ACT NOW"]
UIDS = [f"gloss/test.en:{i}" for i in range(len(GOLD))]


def hypotheses(texts: list[str], valid: list[bool]) -> list[str]:
    return [t if ok else "" for t, ok in zip(texts, valid)]


def write_greedy(root: Path, name: str, texts: list[str], valid: list[bool], **results: Any):
    """A greedy gloss run on one test set of the six examples; its BLEU as the task scores it
    (an invalid output counts as ""), unless `results` overrides it."""
    config = {"mode": "eval", "seed": 0, "data": {"dir": "/data"}, "task": {"name": "gloss"}}
    config |= {"model": {"name": "tiny"}, "eval": {"decoding": "greedy", "adapter": name}}
    score = corpus_bleu(hypotheses(texts, valid), GOLD)
    record = build_results(
        task="gloss",
        model="tiny",
        decoding="greedy",
        metric="bleu",
        validity=sum(valid) / len(valid),
        truncated=0.0,
        examples_per_second=1.0,
        config=config,
        adapter=name,
        test_set_drawing="disjoint",
        set_ids=[UIDS],
        **({"scores": [score]} | results),
    )
    path = root / name
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (path / "results.json").write_text(json.dumps(record))
    rows = [
        {"set": 0, "uid": uid, "gold": gold, "prediction": text}
        | {"valid": ok, "scores": {"uid": uid, "valid": ok}}
        for uid, gold, text, ok in zip(UIDS, GOLD, texts, valid)
    ]
    (path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def compare(tmp_path: Path) -> dict[str, Any]:
    """comparison.json of every run against the poor run's greedy."""
    out = tmp_path / "out"
    reference = ["--reference", "adapter poor greedy"]
    assert agg.main(["compare", str(tmp_path / "runs"), "--out", str(out), *reference]) == 0
    return json.loads((out / "comparison.json").read_text())


def versus(data: dict[str, Any], adapter: str) -> dict[str, Any]:
    found = next(s for s in data["systems"] if adapter in s["label"])
    return found["versus"][0]


def test_summed_statistics_give_sacrebleus_corpus_bleu():
    """Short, empty and unmatched hypotheses included: sacrebleu's smoothing and brevity
    penalty act on the sums, not per example."""
    for texts in (GOOD, POOR, ["", *GOOD[1:]], ["ZZZ"] * len(GOLD)):
        stats = np.stack([bleu_statistics(t, g) for t, g in zip(texts, GOLD)])
        assert float(set_score(stats.sum(0))) == pytest.approx(corpus_bleu(texts, GOLD), abs=1e-12)


def test_a_bleu_comparison_has_a_paired_bootstrap(tmp_path: Path):
    every = [True] * len(GOLD)
    write_greedy(tmp_path / "runs", "poor", POOR, every)
    write_greedy(tmp_path / "runs", "good", GOOD, every)
    write_greedy(tmp_path / "runs", "same", POOR, every)
    data = compare(tmp_path)
    ahead = versus(data, "good")
    assert ahead["reference"] == "adapter poor greedy"
    boot = ahead["bootstrap"]["examples"]
    assert boot["observed"] == pytest.approx(corpus_bleu(GOOD, GOLD) - corpus_bleu(POOR, GOLD))
    assert 0 < boot["low"] <= boot["observed"] <= boot["high"]
    level = versus(data, "same")["bootstrap"]["examples"]
    assert (level["low"], level["high"]) == pytest.approx((0.0, 0.0))


def test_an_invalid_output_counts_as_empty(tmp_path: Path):
    """The run's score counts its one invalid output as "": read as its text, the recomputed
    BLEU would disagree with the results file and the comparison would refuse it."""
    valid = [False] + [True] * (len(GOLD) - 1)
    write_greedy(tmp_path / "runs", "poor", POOR, [True] * len(GOLD))
    write_greedy(tmp_path / "runs", "good", GOOD, valid)
    ahead = versus(compare(tmp_path), "good")
    expected = corpus_bleu(hypotheses(GOOD, valid), GOLD) - corpus_bleu(POOR, GOLD)
    assert ahead["bootstrap"]["examples"]["observed"] == pytest.approx(expected)


def test_a_bleu_that_its_outputs_do_not_give_is_an_error(tmp_path: Path, capsys):
    write_greedy(tmp_path / "runs", "good", GOOD, [True] * len(GOLD), scores=[0.5])
    assert agg.main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "good/results.json" in error and "bleu" in error and "0.500000000000 in the" in error
