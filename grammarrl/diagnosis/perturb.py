"""Wrong outputs next to a gold one, for the reward to tell apart (`concordance`).

A task whose outputs are JSON objects of independent fields (a custom `json_schema` task,
CoNLL's four entity types) gets per-field perturbations: the gold output with one field changed
to each other value of its closed domain (enum, boolean), to null or the empty string, to a span
of the input that is not the gold value (the longest the grammar accepts), and to a value
copied from a demonstration. Another task gets whole-output perturbations: each other choice of
a `choices` task, else other gold outputs of the labelled pool. Only outputs the task's grammar
accepts are kept, so every pair is one the constrained policy could produce.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grammarrl.tasks.base import Task

WHOLE = "(output)"  # the field name of whole-output perturbations
MAX_SPAN_WORDS = 6  # the longest input span tried as a field value
OTHER_OUTPUTS = 5  # whole-output perturbations per row from the pool's other gold outputs


@dataclass(frozen=True)
class Perturbation:
    """A wrong output: the field changed (`WHOLE` for a whole output), how, and the output."""

    field: str
    kind: str  # other value | empty | input span | demonstration | other choice | other gold
    text: str


@dataclass(frozen=True)
class FieldDomain:
    """A field's values: `values` when closed (enum, boolean), None when open (strings); the
    empty values to try (null, "")."""

    name: str
    values: tuple[Any, ...] | None
    empties: tuple[Any, ...]


def schema_domains(schema: dict[str, Any]) -> list[FieldDomain]:
    """The top-level properties of a JSON schema as field domains."""
    domains = []
    for name, prop in schema.get("properties", {}).items():
        prop = prop if isinstance(prop, dict) else {}
        types = prop.get("type", [])
        types = [types] if isinstance(types, str) else list(types)
        if "enum" in prop:
            values: tuple[Any, ...] | None = tuple(prop["enum"])
        elif "const" in prop:
            values = (prop["const"],)
        elif types == ["boolean"]:
            values = (True, False)
        else:
            values = None
        empties = tuple(e for e, t in ((None, "null"), ("", "string")) if t in types)
        domains.append(FieldDomain(name, values, empties))
    return domains


def field_domains(task: Task) -> list[FieldDomain] | None:
    """The fields of a task whose outputs are JSON objects of independent fields; None for the
    others (whole-output perturbations)."""
    from grammarrl.tasks.conll import FIELDS, ConllTask
    from grammarrl.tasks.custom import CustomTask

    if isinstance(task, CustomTask) and task.spec.kind == "json_schema":
        return schema_domains(task.spec.schema or {})
    if isinstance(task, ConllTask):
        return [FieldDomain(name, None, ("",)) for name in FIELDS]
    return None


def canonical_object(text: str) -> dict[str, Any] | None:
    """A gold output as a JSON object, when it is written the way `json.dumps` writes it (so a
    changed field can be written back the same way); else None."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(value, dict) and json.dumps(value, ensure_ascii=False) == text:
        return value
    return None


def input_spans(text: str) -> list[str]:
    """Spans of up to `MAX_SPAN_WORDS` words of the input, as written and without the
    punctuation around them, longest first, then in reading order."""
    words = text.split()
    spans: dict[str, None] = {}
    for n in range(min(MAX_SPAN_WORDS, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            span = " ".join(words[i : i + n])
            spans.setdefault(span)
            spans.setdefault(span.strip(string.punctuation))
    return [s for s in spans if s]


def field_perturbations(
    gold: str,
    source: str,
    domains: list[FieldDomain],
    demonstrations: list[dict[str, Any]],
    accepts: Callable[[str], bool],
) -> list[Perturbation]:
    """The gold output with one field changed, each way that applies (module docstring), the
    grammar accepting; [] when the gold output is not a canonical JSON object."""
    obj = canonical_object(gold)
    if obj is None:
        return []
    seen = {gold}
    found: list[Perturbation] = []

    def first_accepted(name: str, kind: str, values: list[Any], limit: int | None = 1) -> None:
        taken = 0
        for value in values:
            text = json.dumps({**obj, name: value}, ensure_ascii=False)
            if text in seen or not accepts(text):
                continue
            seen.add(text)
            found.append(Perturbation(name, kind, text))
            taken += 1
            if limit is not None and taken == limit:
                return

    for domain in domains:
        if domain.name not in obj:
            continue
        first_accepted(domain.name, "other value", list(domain.values or ()), limit=None)
        first_accepted(domain.name, "empty", list(domain.empties))
        if domain.values is None:
            first_accepted(domain.name, "input span", input_spans(source))
        shown = [d.get(domain.name) for d in demonstrations]
        first_accepted(domain.name, "demonstration", [v for v in shown if v not in (None, "")])
    return found


def whole_perturbations(
    gold: str, alternatives: list[str], kind: str, accepts: Callable[[str], bool], limit: int
) -> list[Perturbation]:
    """Up to `limit` other outputs from `alternatives` (in their order) that the grammar
    accepts."""
    found: list[Perturbation] = []
    for text in dict.fromkeys(alternatives):
        if len(found) == limit:
            break
        if text != gold and accepts(text):
            found.append(Perturbation(WHOLE, kind, text))
    return found


class Perturber:
    """The perturbations of each labelled row of one task (module docstring)."""

    def __init__(
        self, task: Task, accepts: Callable[[str], bool], pool: list[str], seed: int
    ) -> None:
        self.accepts = accepts
        self.domains = field_domains(task)
        self.demonstrations = [
            obj for ex in task.splits().fewshot if (obj := canonical_object(ex.target)) is not None
        ]
        spec = getattr(task, "spec", None)
        self.choices = list(getattr(spec, "choices", ()) or ())
        self.pool = list(dict.fromkeys(pool))
        self.rng = random.Random(seed)

    @property
    def per_field(self) -> bool:
        return self.domains is not None

    def __call__(self, gold: str, source: str) -> list[Perturbation]:
        if self.domains is not None:
            return field_perturbations(
                gold, source, self.domains, self.demonstrations, self.accepts
            )
        if self.choices:
            return whole_perturbations(
                gold, self.choices, "other choice", self.accepts, len(self.choices)
            )
        others = [t for t in self.pool if t != gold]
        picked = self.rng.sample(others, min(len(others), OTHER_OUTPUTS))
        return whole_perturbations(gold, picked, "other gold", self.accepts, OTHER_OUTPUTS)
