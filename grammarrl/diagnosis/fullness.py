"""How full an output is, for the training λ's guard: a reward whose argmax is emptier than both
greedy's outputs and the gold outputs pulls a trained policy towards emptier outputs, and RLOO
follows that pull all the way (on CoNLL at λ=0.25, to the all-empty object; docs/diagnose.md).
Emptier than greedy alone is no such pull where greedy fills more than gold does: on the
support-triage example greedy names an order number in every message and gold in half of them.
Task-agnostic: a JSON object counts its filled fields, any other output its words."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grammarrl.diagnosis.candidates import Group

FIELDS, WORDS = "filled fields", "words"
EMPTY_VALUES: tuple[Any, ...] = (None, "", [], {})  # false and 0 are values


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def fullness(text: str) -> int:
    """A JSON object's fields whose value is not null, "", [] or {}; else the output's words."""
    value = _json_object(text)
    if value is None:
        return len(text.split())
    return sum(v not in EMPTY_VALUES for v in value.values())


def fullness_unit(groups: Sequence[Group]) -> str:
    """What `fullness` counts on these groups: filled fields where a greedy output is a JSON
    object, else words."""
    return FIELDS if any(_json_object(g.texts[0]) is not None for g in groups) else WORDS


def floor(greedy: float | None, gold: float | None) -> float | None:
    """The fullness below which an argmax pulls towards emptier outputs: the lower of greedy's
    and gold's mean (greedy's alone without gold)."""
    if greedy is None or gold is None:
        return greedy
    return min(greedy, gold)


def gold_fullness(golds: Sequence[str]) -> float | None:
    """The gold outputs' mean fullness; None without one."""
    golds = [g for g in golds if g]
    return sum(fullness(g) for g in golds) / len(golds) if golds else None


def mean_fullness(groups: Sequence[Group], picks: Sequence[int]) -> float | None:
    """The picked candidates' mean fullness over the groups; None without a group."""
    if not groups:
        return None
    return sum(fullness(g.texts[i]) for g, i in zip(groups, picks)) / len(groups)
