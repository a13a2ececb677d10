"""How full an output is, for the training λ's guard: a reward whose argmax is emptier than
greedy's pulls a trained policy towards emptier outputs, and RLOO follows that pull all the way
(on CoNLL at λ=0.25, to the all-empty object; docs/diagnose.md). Task-agnostic: a JSON object
counts its filled fields, any other output its words."""

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


def mean_fullness(groups: Sequence[Group], picks: Sequence[int]) -> float | None:
    """The picked candidates' mean fullness over the groups; None without a group."""
    if not groups:
        return None
    return sum(fullness(g.texts[i]) for g, i in zip(groups, picks)) / len(groups)
