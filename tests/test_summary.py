"""The end-of-training summary (grammarrl.evaluation.summary): frozen vs trained on the same test sets,
summary.md / summary.json / training.png in the run directory, on the tiny model."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from grammarrl.evaluation import summary as summ
from grammarrl.evaluation.curves import read_metrics
from grammarrl.rl.rloo import combine_rewards
from grammarrl.runs.results import build_results, write_results
from tests.conftest import compose_config, train_in

SPEC = "examples/support_tickets/task.yaml"
TINY_TICKETS = [
    "model=tiny",
    "task=custom",
    f"task.spec={SPEC}",
    "logger=none",
    "trainer.max_steps=2",
    "optim.batch_size=1",
    "optim.lr=1e-3",
    "task.max_new_tokens=48",
    "task.dev_size=2",
    "trainer.val_check_interval=2",
    "train.val_size=2",
    "train.checkpoint_every_n_steps=2",
    "eval.num_test_sets=2",
    "eval.test_size=3",
    "eval.batch_size=4",
    "train.eval_baseline=true",
    "eval.score_rewards=true",
    "lambda=0.75",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step training run of the tiny model on the support-ticket example, its frozen
    baseline and its summary, in a scratch working directory."""
    from grammarrl.tasks import load_task

    work = tmp_path_factory.mktemp("work")
    spec = os.path.abspath(SPEC)
    cfg = compose_config(
        [
            *[o.replace(SPEC, spec) for o in TINY_TICKETS],
            f"reward.calibration_file={work}/calibration.json",
        ]
    )
    out, results = train_in(work, cfg)
    return out, results, load_task(cfg)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_summary_files_written(run):
    out, _, _ = run
    data = json.loads((out / "summary.json").read_text())
    text = (out / "summary.md").read_text()
    assert data["num_test_sets"] == 2 and data["test_size"] == 3
    assert "| frozen |" in text and "| trained |" in text and "trained − frozen" in text
    assert "2 test sets of 3 examples cut from the test pool in one fixed order" in text
    assert data["test_set_drawing"] == "disjoint" and "seed+0" not in text
    png = (out / "training.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_summary_matches_the_results_files(run):
    """Metric per set, validity and the paired difference are those of results_baseline.json
    (frozen) and results.json (trained), evaluated on the same test examples."""
    out, _, _ = run
    data = json.loads((out / "summary.json").read_text())
    frozen = json.loads((out / "results_baseline.json").read_text())
    trained = json.loads((out / "results.json").read_text())
    assert data["frozen"]["metric"]["per_set"] == pytest.approx(frozen["scores"])
    assert data["trained"]["metric"]["per_set"] == pytest.approx(trained["scores"])
    assert data["frozen"]["validity"] == frozen["validity"]
    diff = [t - f for f, t in zip(frozen["scores"], trained["scores"])]
    assert data["difference"]["metric"]["per_set"] == pytest.approx(diff)
    uids = [
        {r["uid"] for r in _rows(out / name) if r["set"] == s}
        for name in ("predictions_baseline.jsonl", "predictions.jsonl")
        for s in (0, 1)
    ]
    assert uids[0] == uids[2] and uids[1] == uids[3]


def test_greedy_reward_is_the_training_objective(run):
    """The reward of the greedy outputs per set is the mean over its outputs of
    (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse, each output scored by the frozen model,
    with the σ's the run trained with."""
    out, _, _ = run
    data = json.loads((out / "summary.json").read_text())
    (entry,) = json.loads((out.parents[2] / "calibration.json").read_text())[
        "support_tickets/tiny/n3_b3"
    ]
    assert data["sigma_direct"] == pytest.approx(entry["sigma_direct"])
    assert data["lambda"] == 0.75
    for system, name in (
        ("frozen", "predictions_baseline.jsonl"),
        ("trained", "predictions.jsonl"),
    ):
        rows = _rows(out / name)
        expected = []
        for s in (0, 1):
            scored = [r for r in rows if r["set"] == s and r["reward_direct"] is not None]
            values = [
                0.25 * r["reward_direct"] / entry["sigma_direct"]
                + 0.75 * r["reward_reverse"] / entry["sigma_reverse"]
                for r in scored
            ]
            expected.append(sum(values) / len(values))
        assert data[system]["reward"]["per_set"] == pytest.approx(expected, rel=1e-5)
        assert all(math.isfinite(v) and v < 0 for v in expected)  # mean log-probs over σ's


def test_examples_and_changed_outputs(run):
    out, _, _ = run
    data = json.loads((out / "summary.json").read_text())
    frozen = {r["uid"]: r for r in _rows(out / "predictions_baseline.jsonl")}
    trained = {r["uid"]: r for r in _rows(out / "predictions.jsonl")}
    changed = [u for u in frozen if frozen[u]["prediction"] != trained[u]["prediction"]]
    assert data["distinct_examples"] == len(frozen)
    assert data["changed"]["outputs"] == len(changed)
    # changed outputs first (as many as changed, up to 3); the first unchanged ones only when
    # nothing changed: how many changed depends on the machine's arithmetic
    assert len(data["examples"]) == min(3, len(changed) or len(frozen))
    shown = {r["input"] for r in data["examples"]}
    assert shown <= {frozen[u]["input"] for u in (changed or frozen)}
    by_input = {r["input"]: u for u, r in frozen.items()}
    text = (out / "summary.md").read_text()
    for item in data["examples"]:
        uid = by_input[item["input"]]
        assert item["frozen"] == frozen[uid]["prediction"]
        assert item["trained"] == trained[uid]["prediction"]
        assert item["gold"] == frozen[uid]["gold"] and item["gold"]
        assert item["input"] in text and f"`{item['trained']}`" in text


def test_training_facts_and_curves(run):
    out, _, _ = run
    data = json.loads((out / "summary.json").read_text())
    series = read_metrics(out)
    assert [s for s, _ in series["val/dev_json_fields_f1"]] == [0, 2]  # labelled dev slice
    facts = data["training"]
    assert facts["steps"] == 2
    assert facts["rollout_reward"] == pytest.approx(
        [series["train/reward"][0][1], series["train/reward"][-1][1]]
    )
    assert 0.0 <= facts["identical_groups"] <= 1.0


# --- pure functions, no model -----------------------------------------------------------------


def _evaluation(tmp_path, name, scores, predictions, rewards=None):
    per_set = [
        {"value": v, **({"reward_direct": d, "reward_reverse": r} if rewards else {})}
        for v, (d, r) in zip(scores, rewards or [(0, 0)] * len(scores))
    ]
    rows = [
        {"set": 0, "uid": uid, "input": f"in {uid}", "gold": gold, "prediction": pred}
        for uid, (pred, gold) in predictions.items()
    ]
    results = build_results(
        task="t",
        model="m",
        decoding="greedy",
        metric="exact_match",
        scores=scores,
        validity=1.0,
        truncated=0.0,
        examples_per_second=1.0,
        config=None,
        test_size=len(predictions),
        per_set=per_set,
    )
    results["path"] = str(write_results(tmp_path, results, rows, name=name))
    return results


class ExactTask:
    def score(self, predictions, examples):
        class Scores:
            value = sum(p == e.target for p, e in zip(predictions, examples)) / len(examples)

        return Scores()


def test_compare_counts_better_and_worse_and_shows_changed_examples(tmp_path):
    frozen = _evaluation(
        tmp_path,
        "results_baseline",
        [0.2, 0.3],
        {"a": ("x", "x"), "b": ("y", "z"), "c": ("q", "q"), "d": ("s", "s")},
        rewards=[(-1.0, -2.0), (-1.0, -4.0)],
    )
    trained = _evaluation(
        tmp_path,
        "results",
        [0.5, 0.6],
        {"a": ("x", "x"), "b": ("z", "z"), "c": ("r", "q"), "d": ("s", "s")},
        rewards=[(-0.5, -1.0), (-0.5, -1.0)],
    )
    result = summ.compare(ExactTask(), frozen, trained, 0.5, 0.5, 2.0)
    assert result["changed"] == {"outputs": 2, "better": 1, "worse": 1, "same_score": 0}
    assert [e["input"] for e in result["examples"]] == ["in b", "in c"]
    assert result["examples"][0]["trained_score"] == 1.0
    assert result["difference"]["metric"]["mean"] == pytest.approx(0.3)
    # reward per set: 0.5 * direct / 0.5 + 0.5 * reverse / 2
    assert result["frozen"]["reward"]["per_set"] == pytest.approx([-1.5, -2.0])
    assert result["trained"]["reward"]["per_set"] == pytest.approx([-0.75, -0.75])
    assert result["verdict"].startswith("trained is better than frozen: +0.3000")
    assert "on every set" in result["verdict"]
    text = summ.render(result)
    assert "| frozen | 0.2500 ± 0.0707 | -1.7500 ± 0.3536 | 1.000 |" in text
    assert "2 of 4 distinct test inputs (1 scored better, 1 worse" in text


def test_set_rewards_use_combine_rewards():
    results = {"per_set": [{"reward_direct": -2.0, "reward_reverse": -3.0}]}
    expected = combine_rewards(torch.tensor([-2.0]), torch.tensor([-3.0]), 0.25, 0.4, 0.6)
    assert summ.set_rewards(results, 0.25, 0.4, 0.6) == pytest.approx(expected.tolist())
    assert summ.set_rewards({"per_set": [{"value": 1.0}]}, 0.25, 0.4, 0.6) is None


@pytest.mark.parametrize(
    "frozen, trained, start",
    [
        ([0.40, 0.50, 0.45], [0.42, 0.49, 0.47], "no effect shown: trained − frozen = +0.0100"),
        ([0.40, 0.42, 0.41], [0.30, 0.31, 0.33], "trained is worse than frozen: -0.0967"),
        ([0.40], [0.50], "one test set: trained − frozen = +0.1000"),
    ],
)
def test_verdict(frozen, trained, start):
    diff = [t - f for f, t in zip(frozen, trained)]
    assert summ.verdict(diff, frozen, trained).startswith(start)


def test_examples_are_the_first_better_worse_and_same_in_that_order():
    """The order the summary's heading states, even where an unchanged score comes first."""

    def item(n, before=None, after=None):
        return {
            "n": n,
            **({"frozen_score": before, "trained_score": after} if before is not None else {}),
        }

    changed = [
        item(0, 0.5, 0.5),
        item(1, 0.5, 0.5),
        item(2, 0.0, 1.0),
        item(3, 1.0, 0.0),
        item(4, 0.0, 1.0),
    ]
    assert [i["n"] for i in summ.pick_examples(changed)] == [2, 3, 0]
    only_better = [item(0, 0.0, 1.0), item(1, 0.0, 0.5), item(2, 0.5, 1.0), item(3, 0.0, 1.0)]
    assert [i["n"] for i in summ.pick_examples(only_better)] == [0, 1, 2]
    assert [i["n"] for i in summ.pick_examples([item(0), item(1)])] == [0, 1]  # unlabelled
    assert summ.pick_examples([]) == []
