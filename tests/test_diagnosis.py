"""mode=diagnose: perturbations, argmax per λ, oracle, concordance counts and the verdict's
wording against hand-computed values; the mode end to end on `tiny`; its config checks."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.concordance import ALL, Pair, concordance, pairs_of
from grammarrl.diagnosis.crossfit import lift_interval
from grammarrl.diagnosis.perturb import (
    WHOLE,
    FieldDomain,
    Perturbation,
    field_perturbations,
    input_spans,
    schema_domains,
    whole_perturbations,
)
from grammarrl.diagnosis.selection import (
    Sigmas,
    argmax_index,
    lambda_curve,
    oracle_index,
)
from grammarrl.errors import ConfigError
from grammarrl.job import validate
from grammarrl.types import Example
from tests.conftest import REPO, compose_config

TICKETS = "examples/support_tickets/task.yaml"
SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"enum": ["billing", "shipping", "technical", "account", "returns"]},
        "urgency": {"enum": ["low", "medium", "high"]},
        "order_id": {"type": ["string", "null"], "pattern": "^[A-Z]{2}-[0-9]{5}$"},
        "wants_refund": {"type": "boolean"},
    },
}


def _order_ids_only(text: str) -> bool:
    """What the ticket grammar says of an order number: null or two letters, dash, 5 digits."""
    value = json.loads(text)["order_id"]
    return value is None or re.fullmatch(r"[A-Z]{2}-[0-9]{5}", value) is not None


# --------------------------------------------------------------------------- perturbations


def test_schema_domains_read_enums_booleans_and_nullable_strings():
    assert schema_domains(SCHEMA) == [
        FieldDomain("category", ("billing", "shipping", "technical", "account", "returns"), ()),
        FieldDomain("urgency", ("low", "medium", "high"), ()),
        FieldDomain("order_id", None, (None, "")),
        FieldDomain("wants_refund", (True, False), ()),
    ]


def test_field_perturbations_change_one_field_each_way_the_grammar_accepts():
    gold = (
        '{"category": "billing", "urgency": "low", "order_id": "AB-12345", "wants_refund": false}'
    )
    demo = {
        "category": "returns",
        "urgency": "medium",
        "order_id": "VT-65401",
        "wants_refund": True,
    }
    found = field_perturbations(
        gold,
        "Orders AB-12345 and #CD-67890 were billed twice.",
        schema_domains(SCHEMA),
        [demo],
        _order_ids_only,
    )
    changed = [(p.field, p.kind, json.loads(p.text)[p.field]) for p in found]
    assert changed == [
        ("category", "other value", "shipping"),
        ("category", "other value", "technical"),
        ("category", "other value", "account"),
        ("category", "other value", "returns"),  # the demonstration's category: the same output
        ("urgency", "other value", "medium"),
        ("urgency", "other value", "high"),
        ("order_id", "empty", None),  # "" is not an order number: the grammar refuses it
        ("order_id", "input span", "CD-67890"),  # the "#" stripped; AB-12345 is the gold value
        ("order_id", "demonstration", "VT-65401"),
        ("wants_refund", "other value", True),
    ]
    for p in found:  # every other field is gold's, in gold's layout
        assert {k: v for k, v in json.loads(p.text).items() if k != p.field} == {
            k: v for k, v in json.loads(gold).items() if k != p.field
        }
    assert field_perturbations("not json", "x", schema_domains(SCHEMA), [], bool) == []


def test_input_spans_longest_first_and_whole_output_perturbations():
    assert input_spans("a b, c") == ["a b, c", "a b,", "a b", "b, c", "a", "b,", "b", "c"]
    found = whole_perturbations("b", ["a", "b", "c", "d"], "other choice", lambda t: t != "c", 5)
    assert found == [
        Perturbation(WHOLE, "other choice", "a"),
        Perturbation(WHOLE, "other choice", "d"),
    ]


# --------------------------------------------------------------------------- argmax, oracle


def _group(direct, reverse, texts=None, target="") -> Group:
    texts = texts or [f"t{i}" for i in range(len(direct))]
    return Group(Example("u", "x", target), texts, direct, reverse)


def test_argmax_per_lambda_by_hand():
    # combined = (1-λ)·d/0.5 + λ·r/2; the last candidate is empty (NaN): never picked
    group = _group([-1.0, -0.5, -2.0, math.nan], [-3.0, -4.0, -1.0, math.nan])
    sigmas = Sigmas(0.5, 2.0)
    # λ=0: [-2, -1, -4]; .25: [-1.875, -1.25, -3.125]; .5: [-1.75, -1.5, -2.25];
    # .75: [-1.625, -1.75, -1.375]; 1: [-1.5, -2, -0.5]
    picks = [argmax_index(group, lam, sigmas) for lam in (0, 0.25, 0.5, 0.75, 1)]
    assert picks == [1, 1, 1, 2, 2]
    assert argmax_index(_group([-1.0, -1.0], [-1.0, -1.0]), 0.5, sigmas) == 0  # ties: greedy


@pytest.fixture(scope="module")
def tickets():
    from grammarrl.tasks import load_task

    return load_task(compose_config(["task=custom", f"task.spec={TICKETS}", "data.dir=null"]))


def _ticket(category, urgency="low", order=None, refund=False) -> str:
    return json.dumps(
        {"category": category, "urgency": urgency, "order_id": order, "wants_refund": refund}
    )


def test_oracle_and_metrics_over_labelled_inputs_by_hand(tickets):
    gold = _ticket("billing")
    texts = [_ticket("shipping"), gold, '{"category": "bil']  # greedy, a right sample, truncated
    labelled = Group(Example("a", "x", gold), texts, [-1.0, -2.0, math.nan], [-1.0, -3.0, math.nan])
    unlabelled = Group(Example("b", "y", ""), [_ticket("account")] * 2, [-1.0, -1.0], [-1, -1])
    assert oracle_index(tickets, labelled) == 1
    curve = lambda_curve(tickets, [labelled, unlabelled], [0.0, 1.0], Sigmas(1.0, 1.0))
    # gold's filled fields: category, urgency, wants_refund (false is a value; null is empty).
    # greedy: urgency and refund right, category wrong: tp 2, fp 1, fn 1 -> F1 4/6
    assert curve["greedy"]["value"] == pytest.approx(4 / 6)
    assert curve["greedy"]["fields"]["category"] == 0.0
    assert curve["oracle"]["value"] == 1.0
    assert [p["metric"]["value"] for p in curve["argmax"]] == pytest.approx([4 / 6, 4 / 6])
    assert curve["labelled"] == 1 and curve["inputs"] == 2
    assert curve["distinct_share"] == 0.5  # the unlabelled group's two candidates are the same
    assert curve["valid_candidates"] == 4 / 5
    assert curve["finished_candidates"] == 0  # written groups record no decoding


def test_the_oracle_prefers_inventing_nothing_where_gold_is_empty(tickets):
    """Per-input F1 is 0 for every candidate of an input whose gold fields are all empty; the
    oracle still takes the candidate with fewer false positives, as micro-F1 counts them."""
    empty = json.dumps({"category": None, "urgency": None, "order_id": None, "wants_refund": None})
    texts = [_ticket("billing"), empty]  # greedy invents 3 fields, the sample none
    group = Group(Example("e", "x", empty), texts, [-1.0, -2.0], [-1.0, -2.0])
    assert oracle_index(tickets, group) == 1


def test_lift_interval_is_paired_over_the_inputs(tickets):
    gold = _ticket("billing")
    right = Group(Example("a", "x", gold), [_ticket("shipping"), gold], [-1.0, -2.0], [-1, -1])
    same = Group(Example("b", "y", gold), [gold, gold], [-1.0, -1.0], [-1.0, -1.0])
    groups = [right, same]
    assert lift_interval(tickets, groups, [0, 0], draws=200) == (0.0, 0.0)  # greedy vs itself
    # greedy F1: 4/6 on `right`, 1 on `same`; a resample of the two labelled inputs holds
    # `right` 0, 1 or 2 times (a quarter, a half, a quarter of draws): lift 0, 1/6 or 1/3
    low, high = lift_interval(tickets, groups, [1, 0], draws=2000, seed=0)
    assert (low, high) == pytest.approx((0.0, 1 / 3))


def test_without_gold_the_curve_has_the_reward_gap_and_how_often_the_argmax_moves(tickets):
    groups = [
        _group([-1.0, -0.5], [-1.0, -1.0]),  # λ=0 moves to candidate 1: gap +0.5
        _group([-1.0, -2.0], [-1.0, -0.5]),  # λ=1 moves to candidate 1: gap +0.5
    ]
    curve = lambda_curve(tickets, groups, [0.0, 1.0], Sigmas(1.0, 1.0))
    assert curve["greedy"]["value"] is None and curve["oracle"]["value"] is None
    assert [(p["changed"], p["reward_gap"]) for p in curve["argmax"]] == [(0.5, 0.25), (0.5, 0.25)]


# --------------------------------------------------------------------------- concordance


def test_concordance_counts_by_hand():
    a, b = Perturbation("a", "empty", "x"), Perturbation("b", "other value", "y")
    pairs = [
        Pair("1", a, (-1.0, -2.0), (-2.0, -1.0)),  # direct yes, reverse no, combined .5: tie
        Pair("2", a, (-1.0, -1.0), (-1.0, -3.0)),  # direct tie, reverse yes, combined yes
        Pair("3", b, (-3.0, -1.0), (-1.0, -2.0)),  # direct no, reverse yes, combined -2 < -1.5
    ]
    table = concordance(pairs, [0.5], Sigmas(1.0, 1.0))
    assert list(table) == ["a", "b", ALL]
    assert table["a"]["pairs"] == 2 and table["a"]["kinds"] == {"empty": 2}
    # 1 of 2: Wilson's 95% interval 0.5 ± 1.96·√(1/8 + 1.96²/16) / (1 + 1.96²/2)
    half = {"share": 0.5, "interval": pytest.approx((0.0945, 0.9055), abs=1e-4)}
    assert table["a"]["direct"] == {"gold_preferred": 1, "ties": 1, **half}
    assert table["a"]["reverse"] == {"gold_preferred": 1, "ties": 0, **half}
    assert table["a"]["combined"]["0.5"] == {"gold_preferred": 1, "ties": 1, **half}
    assert table["b"]["combined"]["0.5"]["gold_preferred"] == 0
    assert table[ALL]["pairs"] == 3
    assert [table[ALL][k]["gold_preferred"] for k in ("direct", "reverse")] == [1, 2]


def test_pairs_of_a_written_group_skip_unscorable_perturbations():
    perturbations = [Perturbation("a", "empty", "p"), Perturbation("a", "empty", "q")]
    group = _group([-1.0, -2.0, math.nan], [-1.0, -2.0, math.nan], ["g", "p", "q"])
    assert pairs_of(group, perturbations) == [Pair("u", perturbations[0], (-1, -1), (-2, -2))]


# --------------------------------------------------------------------------- config, the mode


@pytest.mark.parametrize(
    "override, key",
    [
        ("diagnose.num_inputs=0", "diagnose.num_inputs"),
        ("diagnose.num_samples=0", "diagnose.num_samples"),
        ("diagnose.num_labelled=0", "diagnose.num_labelled"),
        ("diagnose.lambdas=[0.5,1.5]", "diagnose.lambdas"),
        ("diagnose.lambdas=[]", "diagnose.lambdas"),
        ("diagnose.blind_below=2", "diagnose.blind_below"),
        ("diagnose.min_lift=-1", "diagnose.min_lift"),
        ("diagnose.bootstrap_draws=0", "diagnose.bootstrap_draws"),
        ("+diagnose.num_input=3", "diagnose.num_input"),
    ],
)
def test_bad_diagnose_values_are_refused_before_any_model_loads(override, key, monkeypatch):
    from grammarrl.run import dispatch

    def loaded(*args, **kwargs):
        raise AssertionError("data or a model was loaded before the config was refused")

    monkeypatch.setattr("grammarrl.tasks.load_task", loaded)
    monkeypatch.setattr("grammarrl.models.loading.load_model", loaded)
    with pytest.raises(ConfigError) as err:
        dispatch(compose_config(["model=tiny", "logger=none", "mode=diagnose", override]))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)
    validate(compose_config(["mode=diagnose", "diagnose.lambdas=[0,1]"]))


def test_diagnose_end_to_end_on_tiny_writes_its_files(tmp_path, cache_dir, capsys):
    out = tmp_path / "run"
    env = dict(os.environ, GRAMMARRL_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "grammarrl.run", "mode=diagnose", "model=tiny", "logger=none",
        "task=custom", f"task.spec={TICKETS}", "diagnose.num_inputs=2", "diagnose.num_labelled=2",
        "diagnose.num_samples=2",
        "diagnose.lambdas=[0,0.5,1]", "reward.sigma_direct=0.5", "reward.sigma_reverse=0.25",
        "task.max_new_tokens=24", f"hydra.run.dir={out}",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads((out / "diagnosis.json").read_text())["verdict"]
    assert f"λ={verdict['reranking_lambda']:g}" in proc.stdout
    assert {"training_lambda", "undecided"} <= set(verdict)
    for name in ("diagnosis.json", "diagnosis.md", "diagnosis.png"):
        assert (out / name).stat().st_size > 0
    record = json.loads((out / "diagnosis.json").read_text())
    assert {"verdict", "sigmas", "settings", "candidates", "fields", "seconds"} <= set(record)
    assert record["sigmas"] == {"direct": 0.5, "reverse": 0.25, "source": "config"}
    candidates = record["candidates"]
    assert candidates["inputs"] == 2 and candidates["candidates_per_input"] == 3
    assert candidates["labelled"] == 0  # the tickets' dev file has no gold outputs
    assert [p["lambda"] for p in candidates["argmax"]] == [0.0, 0.5, 1.0]
    assert candidates["crossfit"] is None  # nothing labelled to cross-fit on
    assert record["settings"]["bootstrap_draws"] == 2000
    fields = record["fields"]
    assert fields["labelled"] == 2 and fields["rows"].startswith("the first labelled training")
    table = fields["table"]
    assert set(table) == {"category", "urgency", "order_id", "wants_refund", ALL}
    # every ticket has 4 other categories, 2 other urgencies and the other refund flag
    assert (table["category"]["pairs"], table["urgency"]["pairs"]) == (8, 4)
    assert table["wants_refund"]["pairs"] == 2
    assert record["verdict"]["text"] in (out / "diagnosis.md").read_text()
    assert record["config"]["task"]["spec"] == "examples/support_tickets/task.yaml"
    assert str(REPO) not in (out / "diagnosis.json").read_text()  # paths as run records name them
    # judged again from its rows, no model: the same numbers; a new line moves the fields only
    from experiments.rejudge import main as rejudge

    assert rejudge([str(out), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "diagnosis.json").read_text())
    assert again["candidates"] == candidates and again["fields"] == fields
    assert again["verdict"] == record["verdict"] and again["rejudged"] == {"overrides": []}
    assert rejudge([str(out), "--out", str(tmp_path / "low"), "diagnose.blind_below=0.01"]) == 0
    lower = json.loads((tmp_path / "low" / "diagnosis.json").read_text())
    assert (
        "blind_below=60%" in record["verdict"]["text"] and lower["settings"]["blind_below"] == 0.01
    )
    assert "blind_below=1%" in lower["verdict"]["text"] and lower["verdict"]["blind"] == []
    assert rejudge([str(out), "--out", str(tmp_path / "no"), "seed=5"]) == 2
    assert "seed=5: fixed by the recorded rows" in capsys.readouterr().err
    # the same job again is skipped (its diagnosis.json is there); training's keys do not count
    from grammarrl.job import compose_job_config
    from grammarrl.runs.rundir import plan_job

    same = compose_job_config([*command[3:-1], "trainer.max_steps=7", "lora.r=4"])
    validate(same)  # composed and checked as the command line does
    assert plan_job(same, out).done == record
