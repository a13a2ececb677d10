"""Evidence III's span attribution (experiments/studies/evidence3_spans.py): variants of an
output, the shaped reward's terms, and what each pays for a span, on hand-set scores."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.studies import evidence3_spans as spans

WEIGHTS = {"direct": 0.5, "reverse": 2.0, "beta": 0.1}


def conll(person: str = "", location: str = "") -> str:
    return json.dumps({"person": person, "organization": "", "location": location, "misc": ""})


def test_variants_empty_one_filled_field_at_a_time():
    found = spans.variants(conll(person="Ann", location="Rome"))
    assert [field for field, _ in found] == [None, "person", "location"]
    assert json.loads(found[1][1])["person"] == "" and json.loads(found[1][1])["location"] == "Rome"
    assert spans.variants(conll()) == [(None, conll())]


def test_payments_weigh_each_term_as_the_shaped_reward_does():
    scores = {
        "direct": torch.tensor([-1.0]),
        "reverse": torch.tensor([-3.0]),
        "policy_logp": torch.tensor([-5.0]),
        "ref_logp": torch.tensor([-8.0]),
    }
    assert spans.payments(scores, WEIGHTS).tolist() == [[-0.5, -6.0, pytest.approx(-0.3)]]


def test_span_rows_pay_each_term_full_minus_emptied_and_split_right_from_wrong():
    # a right person (Ann) and a wrong location (Rome, gold Oslo)
    record = {"uid": "a", "prediction": conll(person="Ann", location="Rome")}
    golds = {"a": conll(person="Ann", location="Oslo")}

    def score(_, texts):  # full, without person, without location
        assert len(texts) == 3
        return {
            "direct": torch.tensor([-1.0, -0.8, -0.9]),
            "reverse": torch.tensor([-3.0, -4.0, -2.5]),
            "policy_logp": torch.tensor([-20.0, -14.0, -12.0]),
            "ref_logp": torch.tensor([-24.0, -16.0, -15.0]),
        }

    person, location = spans.span_rows([record], score, WEIGHTS, golds)
    assert (person["field"], person["right"], location["right"]) == ("person", True, False)
    # direct: 0.5·(−1 − −0.8); reverse: 2·(−3 − −4); kl: −0.1·((−20+24) − (−14+16))
    assert person["direct"] == pytest.approx(-0.1) and person["reverse"] == pytest.approx(2.0)
    assert person["kl"] == pytest.approx(-0.2)
    # location: reverse 2·(−3 − −2.5) = −1; kl −0.1·(4 − 3) = −0.1
    assert location["reverse"] == pytest.approx(-1.0) and location["kl"] == pytest.approx(-0.1)
    found = spans.summary([person, location])
    assert found["right"]["spans"] == 1 and found["right"]["kept"] == 1.0
    assert found["wrong"]["kept"] == 0.0 and found["wrong"]["kept without KL"] == 0.0
    assert found["all"]["total"] == pytest.approx((1.7 - 1.15) / 2)
    assert "| wrong | 1 | -0.050 | -1.000 | -0.100 | -1.150 | 0.00 | 0.00 |" in spans.markdown(
        found
    )


def test_by_lambda_re_weighs_the_same_spans():
    # run's weights: λ=0.5, σ's (1, 0.25): direct 0.5, reverse 2; raw ΔR_direct +1, ΔR_reverse −0.2
    wrong = {"right": False, "direct": 0.5, "reverse": -0.4, "kl": 0.1}
    right = {"right": True, "direct": -0.5, "reverse": 2.0, "kl": -0.1}
    weights = {"direct": 0.5, "reverse": 2.0}
    direct_only, reverse_only = spans.by_lambda([wrong, right], weights, (1.0, 0.25), (0.0, 1.0))
    assert direct_only["wrong kept without KL"] == 1.0 and direct_only["wrong kept"] == 1.0
    assert direct_only["right kept without KL"] == 0.0  # −1 from the direct reward
    assert reverse_only["wrong kept without KL"] == 0.0 and reverse_only["wrong kept"] == 0.0
    assert reverse_only["right kept"] == 1.0  # 4·1 − 0.1
    assert "| 1.00 | 1.00 | 1.00 | 0.00 | 0.00 |" in spans.lambda_markdown([reverse_only])
