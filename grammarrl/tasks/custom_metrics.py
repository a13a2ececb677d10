"""The metrics of `task=custom` over parsed outputs: exact match (JSON compared by value) and
per-field precision/recall/F1 of JSON objects."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grammarrl.tasks.metrics import entity_prf


def canonical(value: Any) -> str:
    """A JSON value's comparable form: keys sorted, no float/int/bool confusion."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def exact_match(predictions: Sequence[Any], golds: Sequence[Any]) -> list[bool]:
    """Per example: the parsed prediction equals the parsed gold (JSON compared by value, with
    keys in any order; an invalid prediction, None, never matches)."""
    return [
        p is not None and canonical(p) == canonical(g)
        for p, g in zip(predictions, golds, strict=True)
    ]


def field_values(value: Any) -> dict[str, str]:
    """A JSON object's fields as comparable strings; "" for an absent or empty field (null, "",
    [], {}); 0 and false are values. A non-object (or None) has no fields."""
    if not isinstance(value, dict):
        return {}
    return {k: "" if v in (None, "", [], {}) else canonical(v) for k, v in value.items()}


def json_fields_prf(
    predictions: Sequence[Any], golds: Sequence[Any], field_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The CoNLL rule (`metrics.entity_prf`) per JSON field: tp when the gold field is filled and
    the prediction equals it, fp when the prediction is filled and differs, fn when the gold is
    filled and the prediction differs. Fields: `field_names`, else every key of the golds."""
    gold_fields = [field_values(g) for g in golds]
    if field_names is None:
        field_names = list(dict.fromkeys(k for g in gold_fields for k in g))
    return entity_prf([field_values(p) for p in predictions], gold_fields, field_names)
