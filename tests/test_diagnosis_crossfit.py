"""mode=diagnose's checkable prediction: the lift cross-fitted over two halves of the labelled
inputs (by hand), how full an output is, and, on candidate groups recorded on CoNLL, a training
λ that is not one at which RLOO empties the outputs."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict

import pytest

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.crossfit import cross_fit
from grammarrl.diagnosis.fullness import fullness
from grammarrl.diagnosis.selection import Sigmas, lambda_curve
from grammarrl.diagnosis.verdict import make_verdict
from grammarrl.tasks.conll import FIELDS, output_fields
from grammarrl.tasks.metrics import entity_prf
from grammarrl.types import Example, Scores
from tests.conftest import REPO, compose_config

RECORDED = REPO / "tests" / "data" / "diagnosis_conll_candidates.json"


class RecordedConll:
    """CoNLL's metric (micro-F1 over the four fields, `metrics.entity_prf`, as `ConllTask.score`
    counts it) on outputs its grammar accepted when they were decoded: the real task checks
    them against a vocabulary read from the data, which tests do not have."""

    metric_name = "micro_f1"

    @staticmethod
    @functools.cache
    def _counts(prediction: str, target: str) -> dict:
        return entity_prf([output_fields(prediction)], [output_fields(target)], FIELDS)

    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        per_example, counts = [], {}
        for ex, prediction in zip(examples, predictions):
            own = self._counts(prediction, ex.target)
            counts = {name: counts[name] + prf for name, prf in own.items()} if counts else own
            item = own["micro"]
            per_example.append({"uid": ex.uid, "tp": item.tp, "fp": item.fp, "fn": item.fn})
        details = {name: prf.as_dict() for name, prf in counts.items()}
        return Scores(self.metric_name, counts["micro"].f1, per_example, details)


def _conll(location: str = "") -> str:
    return json.dumps({"person": "", "organization": "", "location": location, "misc": ""})


def _no_pairs(lam: float) -> float:
    return -1.0  # no perturbation pairs to break ties with


def test_fullness_counts_a_json_objects_filled_fields_else_words():
    assert fullness('{"a": "", "b": null, "c": false, "d": "x", "e": [], "f": 0, "g": {}}') == 3
    assert fullness(_conll()) == 0 and fullness(_conll("Paris")) == 1
    assert fullness("noun verb-PAST det") == 3 and fullness('["a", "b"]') == 2
    assert fullness('{"location": "Par') == 2  # cut: not JSON, its words


def test_cross_fit_chooses_lambda_on_one_half_and_measures_on_the_other():
    """Inputs 1 and 3 (first half) rerank right at λ=0; inputs 2 and 4 (second half) best at
    λ=1. Applied across, neither λ finds a right entity: in-sample λ=0 scores 4/7, cross-fitted
    the lift is 0, and the verdict says training is unlikely to help."""
    gold = _conll("Paris")
    right, wrong = [_conll(), gold], [_conll(), _conll("Rome")]  # greedy first: empty
    to_alt_at_0 = ([-1.0, -0.5], [-1.0, -2.0])  # the direct reward prefers the alternative
    to_alt_at_1 = ([-0.5, -1.0], [-2.0, -1.0])  # the reverse reward does
    groups = [
        Group(Example(uid, "x", gold), texts, *rewards)
        for uid, texts, rewards in (
            ("1", right, to_alt_at_0),
            ("2", wrong, to_alt_at_0),
            ("3", right, to_alt_at_0),
            ("4", right, to_alt_at_1),
        )
    ]
    task, sigmas = RecordedConll(), Sigmas(1.0, 1.0)
    curve = lambda_curve(task, groups, [0.0, 1.0], sigmas)
    # λ=0 in-sample: inputs 1, 3 right, 2 wrong, 4 empty: tp 2, fp 1, fn 2
    assert curve["argmax"][0]["metric"]["value"] == pytest.approx(4 / 7)
    crossfit = cross_fit(task, groups, [0.0, 1.0], sigmas, _no_pairs, draws=2000)
    assert crossfit is not None and crossfit.lambdas == (0.0, 1.0)
    # inputs 1, 3 at λ=1 and 4 at λ=0: greedy's empty output; input 2 at λ=0: the wrong entity
    assert (crossfit.greedy, crossfit.picked, crossfit.lift) == (0.0, 0.0, 0.0)
    assert crossfit.interval == (0.0, 0.0) and crossfit.inputs == 4 and crossfit.draws == 2000
    verdict = make_verdict(curve, None, "micro_f1", 0.5, 0.02, 0.6, crossfit=asdict(crossfit))
    assert verdict.outlook == "unlikely" and verdict.reranking_lambda == 0.0
    assert cross_fit(task, groups[:1], [0.0, 1.0], sigmas, _no_pairs, draws=10) is None
    assert compose_config(["mode=diagnose"]).diagnose.bootstrap_draws == 2000


def _recorded() -> tuple[list[Group], Sigmas, list[float]]:
    """The recorded CoNLL groups (tests/data/diagnosis_conll_candidates.json says whence)."""
    data = json.loads(RECORDED.read_text())

    def text(values: list[str]) -> str:
        return json.dumps(dict(zip(data["fields"], values)), ensure_ascii=False)

    groups = [
        Group(
            Example(group["uid"], "", text(group["gold"])),
            [text(c[:4]) for c in group["candidates"]],
            [c[4] for c in group["candidates"]],
            [c[5] for c in group["candidates"]],
        )
        for group in data["groups"]
    ]
    return groups, Sigmas(**data["sigmas"]), data["lambdas"]


def test_on_recorded_conll_groups_the_training_lambda_does_not_empty_outputs():
    """Evidence II's prompts, 40 dev inputs: reranking picks best at λ=0.5 (0.25 and 0.5 on the
    halves), where the argmax fills 1.20 fields per output against greedy's 1.425 (0.95 at
    λ=0.25); RLOO at 0.25 and at 0.5 emptied the outputs (experiments/results/evidence3.md), at
    0.75 it trained. The training λ is 0.75."""
    groups, sigmas, lambdas = _recorded()
    task = RecordedConll()
    curve = lambda_curve(task, groups, lambdas, sigmas)
    assert curve["greedy"]["fullness"] == pytest.approx(1.425)
    assert [p["fullness"] for p in curve["argmax"]] == pytest.approx([0.6, 0.95, 1.2, 1.5, 2.075])
    assert [p["emptier"] for p in curve["argmax"]] == [True, True, True, False, False]
    crossfit = cross_fit(task, groups, lambdas, sigmas, _no_pairs, draws=2000)
    assert crossfit is not None and crossfit.lambdas == (0.25, 0.5)
    assert crossfit.lift == pytest.approx(0.1392, abs=1e-4)
    assert crossfit.interval == pytest.approx((0.0558, 0.2205), abs=1e-4)
    verdict = make_verdict(curve, None, "micro_f1", 0.75, 0.02, 0.6, crossfit=asdict(crossfit))
    assert verdict.outlook == "likely" and verdict.reranking_lambda == 0.5
    assert verdict.training_lambda == 0.75
    assert curve["gold_fullness"] == {"value": pytest.approx(1.775), "of": "dev inputs"}
    assert (
        "at λ=0, 0.25, 0.5 the reward's argmax is emptier than both greedy's 1.43 and the gold "
        "outputs' 1.77 (of the dev inputs)" in verdict.text
    )


def _filled(**values: str) -> str:
    return json.dumps({name: values.get(name, "") for name in FIELDS})


@pytest.mark.parametrize(
    ("dev_gold", "labelled_golds", "emptier"),
    [
        (True, (), False),  # gold fills one field, as the argmax: no pull below it
        (False, (_filled(person="Ada"),), False),  # no dev gold: the labelled rows' gold
        (False, (), True),  # no gold at all: greedy's fullness is the floor
    ],
)
def test_an_argmax_emptier_than_greedy_but_as_full_as_gold_is_no_pull(
    dev_gold, labelled_golds, emptier
):
    """Greedy fills a field gold leaves empty (the support-triage case: an order number in every
    message): the argmax that drops it is emptier than greedy, not than gold, and RLOO trained
    there (the quick start); training λ stays the reranking λ."""
    gold = _filled(person="Ada")
    group = Group(
        Example("u", "", gold if dev_gold else ""),
        [_filled(person="Ada", organization="Acme"), gold],
        [-1.0, -0.5],  # the one-field output wins under both terms, at every λ
        [-3.0, -2.0],
    )
    curve = lambda_curve(RecordedConll(), [group] * 4, [0.0, 1.0], Sigmas(1.0, 1.0), labelled_golds)
    assert curve["greedy"]["fullness"] == 2 and [p["fullness"] for p in curve["argmax"]] == [1, 1]
    assert [p["emptier"] for p in curve["argmax"]] == [emptier, emptier]
    expected_gold = None if emptier else 1.0
    assert curve["gold_fullness"]["value"] == expected_gold
