"""mode=diagnose's verdict: the outlook from the cross-fitted lift, the reranking λ against the
training λ (never one whose argmax is emptier than greedy's), and the fields judged by the 95%
interval of the reverse reward's share, each against hand-built λ curves and tables."""

from __future__ import annotations

from grammarrl.diagnosis.concordance import ALL, share_interval
from grammarrl.diagnosis.verdict import judge_fields, make_verdict

LAMBDAS = [0.0, 0.25, 0.5, 0.75, 1.0]
TICKET_FIELDS = {"category": (33, 48), "urgency": (11, 24), "order_id": (13, 17), "wants_refund": (2, 12), "x": (1, 2)}  # fmt: skip


def _tally(hits: int, pairs: int) -> dict:
    return {
        "gold_preferred": hits,
        "ties": 0,
        "share": hits / pairs,
        "interval": share_interval(hits, pairs),
    }


def _fields(rows: dict[str, tuple[int, int]], lambdas) -> dict:
    """A concordance table whose rewards prefer gold `hits` of `pairs` times at every λ."""
    table = {}
    for name, (hits, pairs) in {**rows, ALL: tuple(map(sum, zip(*rows.values())))}.items():
        tally = _tally(hits, pairs)
        table[name] = {
            "pairs": pairs,
            "kinds": {},
            "direct": tally,
            "reverse": tally,
            "combined": {str(lam): tally for lam in lambdas},
        }
    return table


def _curve(greedy, oracle, argmax, lambdas, labelled=40, fullness=None) -> dict:
    """A λ curve; `fullness`: the argmax's filled fields per output at each λ (greedy's: 1)."""
    fullness = fullness or [1.0] * len(lambdas)
    return {
        "inputs": 40,
        "labelled": labelled,
        "distinct_share": 0.9,
        "fullness_unit": "filled fields",
        "greedy": {"value": greedy, "fields": {}, "fullness": 1.0},
        "oracle": {"value": oracle, "fields": {}},
        "argmax": [
            {
                "lambda": lam,
                "metric": {"value": v, "fields": {}},
                "fullness": full,
                "emptier": full < 1.0,
                "changed": 0.5,
                "reward_gap": 1.25,
            }
            for lam, v, full in zip(lambdas, argmax, fullness)
        ],
    }


def _crossfit(lift, interval, lambdas=(0.25, 0.5), greedy=0.220) -> dict:
    return {
        "lambdas": lambdas,
        "inputs": 40,
        "greedy": greedy,
        "picked": greedy + lift,
        "lift": lift,
        "interval": interval,
        "draws": 2000,
    }


def _verdict(curve, fields=None, metric="f1", crossfit=None):
    """make_verdict with the config's λ 0.5, min_lift 0.02, blind_below 0.6."""
    return make_verdict(curve, fields, metric, 0.5, 0.02, 0.6, crossfit=crossfit)


# --------------------------------------------------------------------------- outlook


def test_verdict_with_gold_names_the_cross_fitted_lift_the_fields_and_the_lambda():
    curve = _curve(0.220, 0.465, [0.159, 0.396, 0.359, 0.365, 0.360], LAMBDAS)
    fields = _fields(TICKET_FIELDS, LAMBDAS)
    verdict = _verdict(curve, fields, "micro_f1", _crossfit(0.12, (0.05, 0.3)))
    assert verdict.outlook == "likely"
    assert (verdict.reranking_lambda, verdict.training_lambda) == (0.25, 0.25)
    assert verdict.text == (
        "Reranking by the reward lifts dev micro_f1 by +0.120 (0.220 → 0.340; cross-fitted: λ "
        "chosen on one half of the 40 labelled dev inputs (λ=0.25 and 0.5), the lift measured "
        "on the other half; 95% interval [+0.050, +0.300] over 2000 resamples of the inputs; "
        "oracle +0.245): training is likely to help. On perturbed gold outputs, the combined "
        "reward at λ=0.25 prefers the gold output in 60 of 103 pairs (58%). Its reverse term, "
        "the part that reads the input, judged by the 95% interval of the share of pairs it "
        "prefers gold in against diagnose.blind_below=60%: it cannot see `wants_refund` (17% of "
        "12 pairs, 95% interval 5%–45%): expect it not to improve, or drop it; undecided, label "
        "more rows (diagnose.num_labelled): `category` (69% of 48 pairs, 95% interval 55%–80%), "
        "`urgency` (46% of 24 pairs, 95% interval 28%–65%), `order_id` (76% of 17 pairs, 95% "
        "interval 53%–90%); fewer than 5 pairs, not judged: `x`. Recommended λ=0.25, for "
        "reranking and for training: its reward's argmax scores best on all 40 labelled dev "
        "inputs (0.396; greedy 0.220)."
    )
    # the fields are judged by the reverse term: a direct reward that prefers gold does not count
    fields["wants_refund"]["direct"] = _tally(12, 12)
    assert _verdict(curve, fields, "micro_f1", _crossfit(0.12, (0.05, 0.3))).blind == [
        "wants_refund"
    ]
    # the same lift with an interval reaching 0 is within noise, not "likely"
    noisy = _verdict(curve, fields, "micro_f1", _crossfit(0.12, (-0.01, 0.3)))
    assert noisy.outlook == "marginal" and "within the noise of these inputs" in noisy.text


def test_the_outlook_follows_the_cross_fitted_lift_not_the_in_sample_peak():
    """The in-sample curve peaks 0.176 above greedy; cross-fitted, the lift is gone."""
    curve = _curve(0.220, 0.465, [0.159, 0.396, 0.359, 0.365, 0.360], LAMBDAS)
    gone = _verdict(curve, None, "micro_f1", _crossfit(-0.01, (-0.09, 0.07), (0.25, 0.75)))
    assert gone.outlook == "unlikely" and gone.reranking_lambda == 0.25
    assert gone.text.startswith(
        "Reranking by the reward does not lift dev micro_f1 (-0.010; cross-fitted: λ chosen on "
        "one half of the 40 labelled dev inputs (λ=0.25 and 0.75)"
    )
    flat = _verdict(curve, None, "micro_f1", _crossfit(0.01, (0.001, 0.02), (0.25, 0.25)))
    assert flat.outlook == "marginal"
    assert (
        "by only +0.010 (cross-fitted: λ chosen on one half of the 40 labelled dev inputs "
        "(λ=0.25 on each)" in flat.text
    )
    assert "less than diagnose.min_lift=0.02" in flat.text
    one = _verdict(_curve(0.5, 0.7, [0.4, 0.6], [0.0, 1.0], labelled=1), None, "f1", None)
    assert one.outlook == "unmeasured" and one.text.startswith(
        "Only 1 dev input has a gold output: too few to choose λ on one half"
    )


def test_verdict_without_gold_recommends_by_the_perturbation_pairs():
    fields = _fields({"category": (2, 10)}, [0.0, 1.0])
    fields["category"]["combined"]["1.0"] = _tally(8, 10)
    none = _verdict(_curve(None, None, [None, None], [0.0, 1.0], 0), fields, "f1", None)
    assert none.outlook == "unmeasured" and none.reranking_lambda == 1.0
    assert none.text.startswith(
        "The 40 dev inputs have no gold outputs, so the metric cannot be measured here: at λ=1 "
        "the reward's argmax differs from greedy on 50% of them (its combined reward +1.25 above "
        "greedy's, in σ units), and 90% of the groups hold distinct candidates"
    )
    assert "prefers the gold output most often, averaged over the fields (80%;" in none.text
    assert "it cannot see `category` (20% of 10 pairs, 95% interval 6%–51%)" in none.text
    few = _verdict(_curve(0.5, 0.7, [0.4, 0.5], [0.0, 1.0]), _fields({"a": (1, 2)}, [0.0, 1.0]))
    assert "against diagnose.blind_below=60%: fewer than 5 pairs, not judged: `a`." in few.text


# --------------------------------------------------------------------------- blind fields


def test_a_field_is_blind_only_when_its_whole_interval_lies_below_the_line():
    """Shares below blind_below (52%, 46%) whose interval reaches it are undecided, not blind;
    a share above it (69%) whose interval reaches below it is undecided, not seen."""
    fields = _fields(
        {
            "urgency": (21, 40),  # 52%, 37%–67%: straddles 60%
            "wants_refund": (2, 12),  # 17%, 5%–45%: below
            "reply": (13, 40),  # 32%, 20%–48%: below
            "category": (70, 80),  # 88%, 78%–93%: above
            "order_id": (33, 48),  # 69%, 55%–80%: straddles
            "x": (1, 2),
        },
        LAMBDAS,
    )
    judged = judge_fields(fields, 0.6)
    assert judged.blind == ["wants_refund", "reply"]
    assert judged.seen == ["category"]
    assert judged.undecided == ["urgency", "order_id"]
    assert judged.few == ["x"]
    verdict = _verdict(
        _curve(0.2, 0.4, [0.3] * 5, LAMBDAS), fields, "f1", _crossfit(0.1, (0.02, 0.2))
    )
    assert verdict.blind == ["wants_refund", "reply"] and verdict.undecided == judged.undecided
    assert (
        "undecided, label more rows (diagnose.num_labelled): `urgency` (52% of 40 pairs, 95% "
        "interval 37%–67%), `order_id` (69% of 48 pairs, 95% interval 55%–80%)" in verdict.text
    )
    assert "it sees `category` (88% of 80 pairs, 95% interval 78%–93%)" in verdict.text
    # a line below every interval: each field with its pairs is seen
    assert judge_fields(fields, 0.04).seen == ["urgency", "wants_refund", "reply", "category", "order_id"]  # fmt: skip


# --------------------------------------------------------------------------- training λ


def test_the_training_lambda_is_never_one_whose_argmax_is_emptier_than_greedy():
    metrics = [0.159, 0.396, 0.359, 0.365, 0.360]  # reranking picks best at λ=0.25
    crossfit = _crossfit(0.12, (0.05, 0.3))
    emptier = _curve(0.220, 0.465, metrics, LAMBDAS, fullness=[0.5, 0.8, 1.2, 1.1, 1.5])
    verdict = _verdict(emptier, None, "micro_f1", crossfit)
    assert (verdict.reranking_lambda, verdict.training_lambda) == (0.25, 0.75)
    assert verdict.text.endswith(
        "Reranking λ=0.25: its reward's argmax scores best on all 40 labelled dev inputs (0.396; "
        "greedy 0.220). For training: λ=0.75, the best λ whose argmax is not so; at λ=0, 0.25 "
        "the reward's argmax is emptier than greedy's 1.00 (0.50, 0.80 filled fields per "
        "output), and RLOO follows that pull towards emptier outputs (on CoNLL, training at "
        "λ=0.25 emptied 198 of 200 dev outputs)."
    )
    every = _curve(0.220, 0.465, metrics, LAMBDAS, fullness=[0.5, 0.8, 0.9, 0.95, 0.99])
    verdict = _verdict(every, None, "micro_f1", crossfit)
    assert (verdict.reranking_lambda, verdict.training_lambda) == (0.25, None)
    assert (
        "No λ is recommended for training, at λ=0, 0.25, 0.5, 0.75, 1 the reward's argmax is "
        "emptier than greedy"
        in verdict.text
        and "at every λ compared." in verdict.text
    )
    # without gold: the guard holds for the λ the perturbation pairs recommend too
    fields = _fields({"category": (3, 10)}, [0.0, 1.0])
    fields["category"]["combined"]["1.0"] = _tally(8, 10)
    curve = _curve(None, None, [None, None], [0.0, 1.0], 0, fullness=[1.0, 0.5])
    verdict = _verdict(curve, fields)
    assert (verdict.reranking_lambda, verdict.training_lambda) == (1.0, 0.0)
