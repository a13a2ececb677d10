"""How often the reward prefers the gold output over a perturbed one: per field (or for whole
outputs), the share of (gold, perturbed) pairs where the direct, the reverse and, at each λ, the
combined reward score gold strictly higher, with the counts and the share's 95% (Wilson)
interval. Pure functions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.perturb import Perturbation
from grammarrl.diagnosis.selection import Sigmas, combined_values

ALL = "all"  # the pooled row of every field
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass(frozen=True)
class Pair:
    """The rewards of a gold output and of one perturbation of it (same input)."""

    uid: str
    perturbation: Perturbation
    gold: tuple[float, float]  # (R_direct, R_reverse)
    other: tuple[float, float]


def pairs_of(group: Group, perturbations: list[Perturbation]) -> list[Pair]:
    """The pairs of a written group: its first text the gold output, then the perturbations in
    order. A pair with a reward that could not be scored is left out."""
    gold = (group.direct[0], group.reverse[0])
    pairs = []
    for i, perturbation in enumerate(perturbations, start=1):
        other = (group.direct[i], group.reverse[i])
        if not any(math.isnan(v) for v in (*gold, *other)):
            pairs.append(Pair(group.example.uid, perturbation, gold, other))
    return pairs


def combined_pair(pair: Pair, lam: float, sigmas: Sigmas) -> tuple[float, float]:
    """(gold's, the perturbation's) combined reward at λ."""
    gold, other = combined_values(
        [pair.gold[0], pair.other[0]], [pair.gold[1], pair.other[1]], lam, sigmas
    )
    return gold, other


def share(hits: int, total: int) -> float | None:
    return hits / total if total else None


def share_interval(hits: int, total: int) -> tuple[float, float] | None:
    """The 95% Wilson score interval of a share of `hits` in `total` pairs; None without pairs.
    (Pairs of one row are counted as independent: an approximation.)"""
    if not total:
        return None
    p, z2 = hits / total, Z95**2 / total
    centre = (p + z2 / 2) / (1 + z2)
    half = Z95 * math.sqrt(p * (1 - p) / total + z2 / (4 * total)) / (1 + z2)
    return max(centre - half, 0.0), min(centre + half, 1.0)


def pairs_share(table: dict[str, Any] | None, name: str, lam: float) -> float:
    """The combined reward's share of gold-preferred pairs of a field (or `ALL`) at λ; -1 when
    it has none."""
    if not table or name not in table or not table[name]["pairs"]:
        return -1.0
    return table[name]["combined"][str(lam)]["share"]


def concordance(pairs: list[Pair], lambdas: Sequence[float], sigmas: Sigmas) -> dict[str, Any]:
    """Per field (in order of first appearance) and for all pairs (`ALL`): `pairs`, and for
    `direct`, `reverse` and each λ of `combined`: `gold_preferred` (strictly higher), `ties`
    and `share`; the kinds of perturbation and their counts."""
    names = list(dict.fromkeys(p.perturbation.field for p in pairs))
    table = {}
    for name in [*names, ALL]:
        chosen = [p for p in pairs if name in (ALL, p.perturbation.field)]
        table[name] = {
            "pairs": len(chosen),
            "kinds": dict(sorted(_count(p.perturbation.kind for p in chosen).items())),
            "direct": _tally([(p.gold[0], p.other[0]) for p in chosen]),
            "reverse": _tally([(p.gold[1], p.other[1]) for p in chosen]),
            "combined": {
                str(lam): _tally([combined_pair(p, lam, sigmas) for p in chosen]) for lam in lambdas
            },
        }
    return table


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _tally(values: list[tuple[float, float]]) -> dict[str, Any]:
    preferred = sum(gold > other for gold, other in values)
    return {
        "gold_preferred": preferred,
        "ties": sum(gold == other for gold, other in values),
        "share": share(preferred, len(values)),
        "interval": share_interval(preferred, len(values)),
    }
