"""The diagnosis in plain words: will training help, which fields the reward cannot see, and
the λ's, and why. Pure functions of the λ curve (`selection.lambda_curve`), the cross-fitted lift
(`crossfit.cross_fit`) and the per-field concordance (`concordance.concordance`).

Two λ's: the reranking λ, at which reranking the candidates by the reward picks best, and the
training λ, the best λ whose argmax is not emptier than both greedy's outputs and the gold
outputs (`fullness.floor`): a reward that prefers emptier outputs pulls a trained policy towards
them (on CoNLL, RLOO at λ=0.25 emptied 198 of 200 dev outputs), however well it reranks a fixed
set of samples.

A field is judged by the reverse reward, the term that reads the input: the direct reward scores
an output by the model's own likelihood, which greedy decoding already follows, so its preference
teaches the policy nothing new about the input. A field is one the reward cannot see (blind)
when the 95% interval of the share of its pairs in which the reverse reward prefers gold lies
below `diagnose.blind_below`, seen when it lies at or above it, undecided when it straddles it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from grammarrl.diagnosis.concordance import ALL, pairs_share
from grammarrl.diagnosis.crossfit import rank_key
from grammarrl.diagnosis.perturb import WHOLE

MIN_PAIRS = 5  # a field with fewer pairs is not judged


class Judged(NamedTuple):
    """The fields by what the reverse reward's 95% interval says of them."""

    blind: list[str]  # the interval lies below diagnose.blind_below
    seen: list[str]  # at or above it
    undecided: list[str]  # it straddles the line: label more rows
    few: list[str]  # fewer than MIN_PAIRS pairs: not judged


@dataclass
class Verdict:
    outlook: str  # likely | marginal | unlikely | unmeasured
    text: str
    reranking_lambda: float  # reranking the candidates by the reward picks best here
    training_lambda: float | None  # recommended for training; None: every λ's argmax is emptier
    why: str  # why the reranking λ
    blind: list[str] = field(default_factory=list)  # fields the reward cannot see
    seen: list[str] = field(default_factory=list)  # fields it prefers gold on
    undecided: list[str] = field(default_factory=list)  # intervals straddling blind_below
    few: list[str] = field(default_factory=list)  # fields with too few pairs to judge


def _metric_at(curve: dict[str, Any], lam: float) -> float:
    return next(p["metric"]["value"] for p in curve["argmax"] if p["lambda"] == lam)


def _judged(fields: dict[str, Any] | None) -> list[str]:
    return [name for name, row in (fields or {}).items() if name != ALL and row["pairs"]]


def _mean_share(fields: dict[str, Any] | None, names: list[str], lam: float) -> float:
    """The combined reward's share of gold-preferred pairs at λ, averaged over the fields."""
    return sum(pairs_share(fields, name, lam) for name in names) / len(names)


def lambda_key(
    curve: dict[str, Any], fields: dict[str, Any] | None, default: float
) -> Callable[[float], Any]:
    """What ranks the λ's: with gold on the dev inputs, the argmax's metric (ties: the most
    gold-preferred perturbation pairs, then the smaller λ); else the combined reward's share of
    gold-preferred pairs averaged over the fields; else the nearness to the config's λ."""
    if curve["greedy"]["value"] is not None:
        return rank_key(partial(_metric_at, curve), partial(pairs_share, fields, ALL))
    judged = _judged(fields)
    if judged:
        return lambda lam: (_mean_share(fields, judged, lam), -lam)
    return lambda lam: (-abs(lam - default), -lam)


def recommend_lambda(
    curve: dict[str, Any], fields: dict[str, Any] | None, default: float
) -> tuple[float, str]:
    """(the reranking λ, why): the best by `lambda_key`; the config's λ where nothing measures
    it."""
    lambdas = [p["lambda"] for p in curve["argmax"]]
    best = max(lambdas, key=lambda_key(curve, fields, default))
    greedy = curve["greedy"]["value"]
    if greedy is not None:
        return best, (
            f"its reward's argmax scores best on all {curve['labelled']} labelled dev inputs "
            f"({_metric_at(curve, best):.3f}; greedy {greedy:.3f})"
        )
    judged = _judged(fields)
    if judged:
        return best, (
            "there the combined reward prefers the gold output most often, averaged over the "
            f"fields ({_mean_share(fields, judged, best):.0%}; each field counts once, however "
            "many perturbations it has); the dev inputs have no gold outputs to measure the "
            "metric on"
        )
    return default, (
        "nothing here measures λ (no gold outputs on the dev inputs, no labelled rows to "
        "perturb): the config's λ"
    )


def _emptier(curve: dict[str, Any], lam: float) -> bool:
    return any(p["emptier"] for p in curve["argmax"] if p["lambda"] == lam)


def training_lambda(
    curve: dict[str, Any], reranking: float, key: Callable[[float], Any]
) -> float | None:
    """The reranking λ unless its argmax is emptier than greedy's; then the best of the others
    by `key` whose argmax is not; None where every λ's is."""
    if not _emptier(curve, reranking):
        return reranking
    fuller = [p["lambda"] for p in curve["argmax"] if not p["emptier"]]
    return max(fuller, key=key) if fuller else None


def judge_fields(fields: dict[str, Any] | None, blind_below: float) -> Judged:
    """The fields whose reverse share's 95% interval lies below `blind_below`, at or above it,
    straddles it; those with fewer than `MIN_PAIRS` pairs."""
    blind: list[str] = []
    seen: list[str] = []
    undecided: list[str] = []
    few: list[str] = []
    for name, row in (fields or {}).items():
        if name == ALL:
            continue
        if row["pairs"] < MIN_PAIRS:
            few.append(name)
            continue
        low, high = row["reverse"]["interval"]
        if high < blind_below:
            blind.append(name)
        elif low >= blind_below:
            seen.append(name)
        else:
            undecided.append(name)
    return Judged(blind, seen, undecided, few)


def _field_share(fields: dict[str, Any], name: str) -> str:
    reverse = fields[name]["reverse"]
    low, high = reverse["interval"]
    return (
        f"{reverse['share']:.0%} of {fields[name]['pairs']} pairs, 95% interval "
        f"{low:.0%}–{high:.0%}"
    )


def _name(name: str) -> str:
    return "the whole output" if name == WHOLE else f"`{name}`"


def _no_gold_sentence(curve: dict[str, Any], lam: float) -> str:
    point = next(p for p in curve["argmax"] if p["lambda"] == lam)
    gap = point["reward_gap"]
    gap_text = f" (its combined reward {gap:+.2f} above greedy's, in σ units)" if gap else ""
    return (
        f"The {curve['inputs']} dev inputs have no gold outputs, so the metric cannot be "
        f"measured here: at λ={lam:g} the reward's argmax differs from greedy on "
        f"{point['changed']:.0%} of them{gap_text}, and {curve['distinct_share']:.0%} of "
        "the groups hold distinct candidates for training to learn from."
    )


def _metric_sentence(
    curve: dict[str, Any],
    metric: str,
    lam: float,
    min_lift: float,
    crossfit: dict[str, Any] | None,
) -> tuple[str, str]:
    """(outlook, sentence): likely where the cross-fitted lift (`crossfit.cross_fit`) reaches
    `min_lift` and its 95% interval lies above 0."""
    greedy, oracle = curve["greedy"]["value"], curve["oracle"]["value"]
    if greedy is None:
        return "unmeasured", _no_gold_sentence(curve, lam)
    if crossfit is None:
        return "unmeasured", (
            f"Only {curve['labelled']} dev input has a gold output: too few to choose λ on one "
            "half of them and measure the lift on the other."
        )
    lift, (low, high) = crossfit["lift"], crossfit["interval"]
    first, second = crossfit["lambdas"]
    chosen = f"λ={first:g} on each" if first == second else f"λ={first:g} and {second:g}"
    where = (
        f"cross-fitted: λ chosen on one half of the {crossfit['inputs']} labelled dev inputs "
        f"({chosen}), the lift measured on the other half; 95% interval [{low:+.3f}, "
        f"{high:+.3f}] over {crossfit['draws']} resamples of the inputs; oracle "
        f"{oracle - greedy:+.3f}"
    )
    if lift >= min_lift and low > 0:
        return "likely", (
            f"Reranking by the reward lifts dev {metric} by {lift:+.3f} ({crossfit['greedy']:.3f} "
            f"→ {crossfit['picked']:.3f}; {where}): training is likely to help."
        )
    if lift > 0:
        short = (
            f"less than diagnose.min_lift={min_lift:g}"
            if lift < min_lift
            else "an interval that reaches 0: within the noise of these inputs"
        )
        return "marginal", (
            f"Reranking by the reward lifts dev {metric} by only {lift:+.3f} ({where}), {short}: "
            "training may not help."
        )
    return "unlikely", (
        f"Reranking by the reward does not lift dev {metric} ({lift:+.3f}; {where}): training is "
        "unlikely to help."
    )


def _fields_clauses(fields: dict[str, Any], judged: Judged) -> list[str]:
    """What the reverse term sees, field by field, in clauses."""
    blind, seen, undecided, few = judged

    def listed(names: list[str]) -> str:
        return ", ".join(f"{_name(name)} ({_field_share(fields, name)})" for name in names)

    clauses = []
    if WHOLE in blind:
        clauses.append(
            f"it cannot tell the gold output from other outputs ({_field_share(fields, WHOLE)}): "
            "expect training not to improve it"
        )
    elif blind:
        it = "them" if len(blind) > 1 else "it"
        clauses.append(f"it cannot see {listed(blind)}: expect {it} not to improve, or drop {it}")
    if seen:
        clauses.append(f"it sees {listed(seen)}")
    if undecided:
        clauses.append(f"undecided, label more rows (diagnose.num_labelled): {listed(undecided)}")
    if few:
        clauses.append(
            f"fewer than {MIN_PAIRS} pairs, not judged: {', '.join(_name(n) for n in few)}"
        )
    return clauses


def _fields_sentence(
    fields: dict[str, Any] | None, lam: float, blind_below: float, judged: Judged
) -> str:
    if not fields or not fields[ALL]["pairs"]:
        return (
            "No perturbation pairs to judge the fields on: the per-field check needs gold "
            "outputs (dev rows, else training rows) that can be perturbed (the report says why)."
        )
    overall = fields[ALL]["combined"][str(lam)]
    return (
        f"On perturbed gold outputs, the combined reward at λ={lam:g} prefers the gold output in "
        f"{overall['gold_preferred']} of {fields[ALL]['pairs']} pairs ({overall['share']:.0%}). "
        "Its reverse term, the part that reads the input, judged by the 95% interval of the "
        f"share of pairs it prefers gold in against diagnose.blind_below={blind_below:.0%}: "
        f"{'; '.join(_fields_clauses(fields, judged))}."
    )


def _lambda_sentence(
    curve: dict[str, Any], reranking: float, training: float | None, why: str
) -> str:
    """The reranking λ and the training λ, and why they differ."""
    if training == reranking:
        return f"Recommended λ={reranking:g}, for reranking and for training: {why}."
    emptier = [p for p in curve["argmax"] if p["emptier"]]
    at = ", ".join(f"{p['lambda']:g}" for p in emptier)
    values = ", ".join(f"{p['fullness']:.2f}" for p in emptier)
    pull = (
        f"at λ={at} the reward's argmax is emptier than {_yardstick(curve)} ({values} "
        f"{curve['fullness_unit']} per output), and RLOO follows that pull towards emptier "
        "outputs (on CoNLL, training at λ=0.25 emptied 198 of 200 dev outputs)"
    )
    head = f"Reranking λ={reranking:g}: {why}."
    if training is None:
        return (
            f"{head} No λ is recommended for training, {pull}: at every λ compared. If you "
            "train anyway, watch the empty outputs of the first validations."
        )
    return f"{head} For training: λ={training:g}, the best λ whose argmax is not so; {pull}."


def _yardstick(curve: dict[str, Any]) -> str:
    """What an argmax's fullness is held against (`fullness.floor`), in words."""
    greedy = f"greedy's {curve['greedy']['fullness']:.2f}"
    gold = curve.get("gold_fullness", {}).get("value")
    if gold is None:
        return greedy
    return f"both {greedy} and the gold outputs' {gold:.2f} (of the {curve['gold_fullness']['of']})"


def make_verdict(
    curve: dict[str, Any],
    fields: dict[str, Any] | None,
    metric: str,
    default_lambda: float,
    min_lift: float,
    blind_below: float,
    *,
    crossfit: dict[str, Any] | None,
) -> Verdict:
    """The verdict (module docstring); `crossfit`: the cross-fitted lift (`CrossFit` as a dict),
    None without it."""
    reranking, why = recommend_lambda(curve, fields, default_lambda)
    training = training_lambda(curve, reranking, lambda_key(curve, fields, default_lambda))
    outlook, first = _metric_sentence(curve, metric, reranking, min_lift, crossfit)
    judged = judge_fields(fields, blind_below)
    text = " ".join(
        [
            first,
            _fields_sentence(fields, reranking, blind_below, judged),
            _lambda_sentence(curve, reranking, training, why),
        ]
    )
    return Verdict(outlook, text, reranking, training, why, *judged)
