"""The diagnosis in plain words: will training help, which fields the reward cannot see, and
the λ to train with, and why. Pure functions of the λ curve (`selection.lambda_curve`) and the
per-field concordance (`concordance.concordance`).

A field is judged by the reverse reward, the term that reads the input: the direct reward scores
an output by the model's own likelihood, which greedy decoding already follows, so its preference
teaches the policy nothing new about the input. A field whose perturbations the reverse reward
scores above gold about as often as below is one training cannot improve, and at a high λ may
move away from gold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grammarrl.diagnosis.concordance import ALL
from grammarrl.diagnosis.perturb import WHOLE

MIN_PAIRS = 5  # a field with fewer pairs is not judged


@dataclass
class Verdict:
    outlook: str  # likely | marginal | unlikely | unmeasured
    text: str
    recommended_lambda: float
    why: str
    blind: list[str] = field(default_factory=list)  # fields the reward cannot see
    seen: list[str] = field(default_factory=list)  # fields it prefers gold on
    few: list[str] = field(default_factory=list)  # fields with too few pairs to judge


def _metric_at(curve: dict[str, Any], lam: float) -> float:
    return next(p["metric"]["value"] for p in curve["argmax"] if p["lambda"] == lam)


def _pairs_share(fields: dict[str, Any] | None, name: str, lam: float) -> float:
    """The combined reward's share of gold-preferred pairs of a field at λ (-1 when none)."""
    if not fields or name not in fields or not fields[name]["pairs"]:
        return -1.0
    return fields[name]["combined"][str(lam)]["share"]


def _mean_share(fields: dict[str, Any], names: list[str], lam: float) -> float:
    """The combined reward's share of gold-preferred pairs at λ, averaged over the fields."""
    return sum(_pairs_share(fields, name, lam) for name in names) / len(names)


def recommend_lambda(
    curve: dict[str, Any], fields: dict[str, Any] | None, default: float
) -> tuple[float, str]:
    """(λ, why): with gold on the dev inputs, the λ whose argmax scores best (ties: the most
    gold-preferred perturbation pairs, then the smaller λ); else the λ whose combined reward
    prefers gold most often, averaged over the fields; else the config's λ."""
    lambdas = [p["lambda"] for p in curve["argmax"]]
    greedy = curve["greedy"]["value"]
    if greedy is not None:
        best = max(
            lambdas, key=lambda lam: (_metric_at(curve, lam), _pairs_share(fields, ALL, lam), -lam)
        )
        return best, (
            f"its reward's argmax scores best on the {curve['labelled']} labelled dev inputs "
            f"({_metric_at(curve, best):.3f}; greedy {greedy:.3f})"
        )
    judged = [name for name, row in (fields or {}).items() if name != ALL and row["pairs"]]
    if judged:
        best = max(lambdas, key=lambda lam: (_mean_share(fields, judged, lam), -lam))
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


def judge_fields(
    fields: dict[str, Any] | None, blind_below: float
) -> tuple[list[str], list[str], list[str]]:
    """(blind, seen, few): the fields whose pairs the reverse reward prefers gold in less than
    `blind_below` of, at least that often, and those with fewer than `MIN_PAIRS` pairs."""
    blind, seen, few = [], [], []
    for name, row in (fields or {}).items():
        if name == ALL:
            continue
        if row["pairs"] < MIN_PAIRS:
            few.append(name)
        elif row["reverse"]["share"] < blind_below:
            blind.append(name)
        else:
            seen.append(name)
    return blind, seen, few


def _field_share(fields: dict[str, Any], name: str) -> str:
    return f"{fields[name]['reverse']['share']:.0%} of {fields[name]['pairs']} pairs"


def _name(name: str) -> str:
    return "the whole output" if name == WHOLE else f"`{name}`"


def _metric_sentence(
    curve: dict[str, Any],
    metric: str,
    lam: float,
    min_lift: float,
    interval: tuple[float, float] | None,
) -> tuple[str, str]:
    """(outlook, sentence) from the λ curve: likely where the lift at λ reaches `min_lift` and
    its bootstrap interval over the inputs (`selection.lift_interval`) lies above 0."""
    greedy, oracle = curve["greedy"]["value"], curve["oracle"]["value"]
    if greedy is None:
        point = next(p for p in curve["argmax"] if p["lambda"] == lam)
        gap = point["reward_gap"]
        gap_text = f" (its combined reward {gap:+.2f} above greedy's, in σ units)" if gap else ""
        return "unmeasured", (
            f"The {curve['inputs']} dev inputs have no gold outputs, so the metric cannot be "
            f"measured here: at λ={lam:g} the reward's argmax differs from greedy on "
            f"{point['changed']:.0%} of them{gap_text}, and {curve['distinct_share']:.0%} of "
            "the groups hold distinct candidates for training to learn from."
        )
    best = _metric_at(curve, lam)
    lift, headroom = best - greedy, oracle - greedy
    spread = f", 95% interval [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else ""
    where = f"oracle {headroom:+.3f}, on {curve['labelled']} labelled dev inputs{spread}"
    if lift >= min_lift and interval is not None and interval[0] > 0:
        return "likely", (
            f"Reranking by the reward lifts dev {metric} by {lift:+.3f} at λ={lam:g} "
            f"({greedy:.3f} → {best:.3f}; {where}): training is likely to help."
        )
    if lift > 0:
        short = (
            f"less than diagnose.min_lift={min_lift:g}"
            if lift < min_lift
            else "an interval that reaches 0: within the noise of these inputs"
        )
        return "marginal", (
            f"Reranking by the reward lifts dev {metric} by only {lift:+.3f} at best (λ={lam:g}; "
            f"{where}), {short}: training may not help."
        )
    return "unlikely", (
        f"Reranking by the reward does not lift dev {metric} at any λ (best {lift:+.3f}, at "
        f"λ={lam:g}; {where}): training is unlikely to help."
    )


def _fields_sentence(
    fields: dict[str, Any] | None,
    lam: float,
    blind_below: float,
    blind: list[str],
    seen: list[str],
    few: list[str],
) -> str:
    if not fields or not fields[ALL]["pairs"]:
        return (
            "No perturbation pairs to judge the fields on: the per-field check needs gold "
            "outputs (dev rows, else training rows) that can be perturbed (the report says why)."
        )
    overall = fields[ALL]["combined"][str(lam)]
    parts = [
        (
            f"On perturbed gold outputs, the combined reward at λ={lam:g} prefers the gold output "
            f"in {overall['gold_preferred']} of {fields[ALL]['pairs']} pairs ({overall['share']:.0%});"
            " its reverse term, the part that reads the input,"
        )
    ]
    if WHOLE in blind:
        parts.append(
            f"prefers it in {_field_share(fields, WHOLE)} only: the reward cannot tell the gold "
            "output from other outputs; expect training not to improve it."
        )
    elif blind:
        listed = " and ".join(f"`{name}` in {_field_share(fields, name)}" for name in blind)
        it = "them" if len(blind) > 1 else "it"
        parts.append(
            f"prefers it for {listed} only: the reward cannot see "
            f"{' or '.join(f'`{name}`' for name in blind)}; expect {it} not to improve, or drop "
            f"{it}."
        )
    elif seen:
        listed = " and ".join(f"`{name}` in {_field_share(fields, name)}" for name in seen)
        parts.append(f"prefers it for {listed}: the reward sees every field it could judge.")
    else:
        parts.append(f"is not judged on any field: each has fewer than {MIN_PAIRS} pairs.")
    if blind and seen:
        listed = ", ".join(f"{_name(name)} ({_field_share(fields, name)})" for name in seen)
        parts.append(f"It sees {listed}.")
    if few:
        parts.append(f"Too few pairs to judge: {', '.join(_name(n) for n in few)}.")
    return " ".join(parts)


def make_verdict(
    curve: dict[str, Any],
    fields: dict[str, Any] | None,
    metric: str,
    default_lambda: float,
    min_lift: float,
    blind_below: float,
    *,
    interval: tuple[float, float] | None,
) -> Verdict:
    """The verdict (module docstring); `interval`: the lift's at the recommended λ."""
    lam, why = recommend_lambda(curve, fields, default_lambda)
    outlook, first = _metric_sentence(curve, metric, lam, min_lift, interval)
    blind, seen, few = judge_fields(fields, blind_below)
    text = " ".join(
        [
            first,
            _fields_sentence(fields, lam, blind_below, blind, seen, few),
            f"Recommended λ={lam:g}: {why}.",
        ]
    )
    return Verdict(outlook, text, lam, why, blind, seen, few)
