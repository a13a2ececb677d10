"""CoNLL-2003 NER as JSON. Output: {"person": s, "organization": s, "location": s, "misc": s}.

Each value is the first span of that type in the sentence, verbatim, or "" if absent. Sentences
without entities are left out (as the paper's authors did). Files: conll2003/{train,valid,test}.txt
(CoNLL columns, IOB2 tags in the last one), or the hub's eriktks/conll2003. Values come from closed per-type
vocabularies of the first spans over all splits (8,804 on the real data). A row whose first
span contains a quote, a backslash or a control character cannot be written in the grammar's
plain strings: it is dropped and counted. Metric: micro-F1 over the four fields.

Search potential (paper table "task-specific potentials"), judged on the closed fields of a
prefix: grounding (-3.0 per value not a verbatim substring of the sentence), word boundary
(-1.5 per value found only inside longer words), duplicate (-1.0 per extra field repeating a
non-empty value).
"""

from __future__ import annotations

import json
import random
import re
from functools import cached_property
from pathlib import Path
from typing import Any

from grammarrl.data.hub import load_hub_dataset
from grammarrl.data.sources import Row, SkipLog, read_lines
from grammarrl.tasks.common import CorpusTask
from grammarrl.tasks.grammar_check import alternation, json_string, lark_literal
from grammarrl.tasks.metrics import entity_prf, validity_rate
from grammarrl.types import Example, Scores

FIELDS = ("person", "organization", "location", "misc")
KEY_ORDER = f"expected the keys {', '.join(FIELDS)} in that order"
TAG_FIELDS = {"PER": "person", "ORG": "organization", "LOC": "location", "MISC": "misc"}
FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
HUB_ID = "eriktks/conll2003"
GROUNDING, BOUNDARY, DUPLICATE = -3.0, -1.5, -1.0
CLOSED_FIELD = re.compile(r'"(person|organization|location|misc)": ("(?:[^"\\]|\\.)*")')


# ----- reading --------------------------------------------------------------------------
def read_conll(directory: Path, skips: SkipLog) -> list[Row]:
    """Sentences of the IOB2 CoNLL files: fields `tokens` and `tags`, located at their first line."""
    rows = []
    for split, name in FILES.items():
        path = directory / name
        tokens: list[str] = []
        tags: list[str] = []
        start, bad = 0, ""
        for number, line in enumerate([*read_lines(path), ""], start=1):
            columns = line.split()
            if columns and columns[0] == "-DOCSTART-":
                continue
            if columns:
                start = start or number
                tag = columns[-1]
                if len(columns) < 2 or not _valid_tag(tag):
                    bad = bad or f"line {number}: {line!r} has no valid NER tag"
                tokens.append(columns[0])
                tags.append(tag)
                continue
            if tokens:
                where = f"{path}:{start}"
                if bad:
                    skips.skip("malformed_line", where, bad)
                else:
                    rows.append(Row(split, {"tokens": tokens, "tags": tags}, where))
            tokens, tags, start, bad = [], [], 0, ""
    return rows


def _valid_tag(tag: str) -> bool:
    return tag == "O" or (tag[:2] in ("B-", "I-") and tag[2:] in TAG_FIELDS)


def read_hub_conll() -> list[Row]:
    """The hub's CoNLL-2003 (parquet conversion), its tag ids mapped to IOB2 names."""
    data = load_hub_dataset(HUB_ID, revision="refs/convert/parquet")
    rows = []
    for split, hub_split in (("train", "train"), ("dev", "validation"), ("test", "test")):
        names = data[hub_split].features["ner_tags"].feature.names
        for i, r in enumerate(data[hub_split]):
            fields = {"tokens": list(r["tokens"]), "tags": [names[t] for t in r["ner_tags"]]}
            rows.append(Row(split, fields, f"{HUB_ID}:{hub_split}:{i}"))
    return rows


# ----- outputs --------------------------------------------------------------------------


def _json_object(text: str) -> dict[str, Any]:
    """The JSON object an output (or a target) is written as: the one reading of outputs that
    `output_fields` and `ConllTask.parse` share; ValueError if it is not one."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"not JSON: {err}") from None
    if isinstance(value, dict):
        return value
    raise ValueError(KEY_ORDER)


def output_fields(text: str) -> dict[str, str]:
    """The four fields of an output as written (vocabulary not checked); an output that is not
    a JSON object leaves every field empty."""
    try:
        value = _json_object(text)
    except ValueError:
        return dict.fromkeys(FIELDS, "")
    return {f: value.get(f) if isinstance(value.get(f), str) else "" for f in FIELDS}


def empty_field_rate(predictions: list[str], targets: list[str]) -> float:
    """Percentage of the gold non-empty fields that the predictions leave empty (the paper's
    "empty fields" statistic of the λ ablation); 0 when no gold field is filled."""
    gold_filled = empty = 0
    for prediction, target in zip(predictions, targets, strict=True):
        gold, pred = output_fields(target), output_fields(prediction)
        for field in FIELDS:
            if gold[field]:
                gold_filled += 1
                empty += not pred[field]
    return 100.0 * empty / gold_filled if gold_filled else 0.0


def bio_spans(tokens: list[str], tags: list[str]) -> list[tuple[str, str]]:
    """(type, span text) in sentence order from IOB2 tags (an I- after O/another type opens)."""
    spans: list[tuple[str, list[str]]] = []
    previous = "O"
    for token, tag in zip(tokens, tags):
        if tag == "O":
            previous = "O"
            continue
        prefix, kind = tag[:2], tag[2:]
        if prefix == "B-" or previous != kind:
            spans.append((kind, [token]))
        else:
            spans[-1][1].append(token)
        previous = kind
    return [(kind, " ".join(words)) for kind, words in spans]


def writable(span: str) -> bool:
    """A span the grammar can emit as a plain JSON string (no quote, backslash or control)."""
    return bool(span) and not any(ch in '"\\' or ord(ch) < 32 for ch in span)


def conll_target(record: dict[str, str]) -> str:
    """The canonical output string, keys in fixed order, ", " and ": " separators."""
    return json.dumps({field: record.get(field, "") for field in FIELDS}, ensure_ascii=False)


# ----- search potential -----------------------------------------------------------------
def closed_fields(text: str) -> dict[str, str]:
    """The closed fields of a (partial) output: a value counts once its closing quote is
    emitted (the values are closed-vocabulary JSON strings)."""
    fields = {}
    for match in CLOSED_FIELD.finditer(text):
        try:
            fields[match.group(1)] = json.loads(match.group(2))
        except json.JSONDecodeError:
            continue
    return fields


def field_penalty(sentence: str, fields: dict[str, str]) -> float:
    """Grounding, word-boundary and duplicate penalties of the closed fields."""
    total = 0.0
    seen: dict[str, int] = {}
    for value in fields.values():
        if not value:
            continue
        seen[value] = seen.get(value, 0) + 1
        if value not in sentence:
            total += GROUNDING
        elif not _on_word_boundary(sentence, value):
            total += BOUNDARY
    total += DUPLICATE * sum(count - 1 for count in seen.values())
    return total


def _on_word_boundary(sentence: str, value: str) -> bool:
    """Some occurrence of `value` is not inside a longer word (alphanumerics on either side)."""
    start = sentence.find(value)
    while start >= 0:
        end = start + len(value)
        before = sentence[start - 1] if start > 0 else " "
        after = sentence[end] if end < len(sentence) else " "
        if not (before.isalnum() and value[0].isalnum()) and not (
            after.isalnum() and value[-1].isalnum()
        ):
            return True
        start = sentence.find(value, start + 1)
    return False


# ----- the task -------------------------------------------------------------------------
class ConllTask(CorpusTask):
    name = "conll"
    metric_name = "micro_f1"
    table_label = "CoNLL (F1-micro)"
    data_dir = "conll2003"
    instruction = (
        "Extract named entities from the sentence. Copy the first span of each type verbatim; "
        "empty string if absent; emit the JSON object only."
    )
    output_format = (
        'Output format: {"person": "...", "organization": "...", "location": "...", "misc": "..."}'
    )
    inverse_instruction = (
        "Given the entity JSON, reconstruct the original sentence as it was actually written. "
        "Output only that sentence."
    )

    def read_local(self, directory: Path) -> list[Row]:
        return read_conll(directory, self.skips)

    def read_hub(self) -> list[Row]:
        return read_hub_conll()

    def normalise(self, row: Row) -> Example | None:
        tokens, tags = row.fields.get("tokens"), row.fields.get("tags")
        if not tokens or not isinstance(tags, list) or len(tags) != len(tokens):
            self.skips.skip("missing_field", row.where, "needs tokens and one tag per token")
            return None
        record: dict[str, str] = {}
        for kind, span in bio_spans(tokens, tags):
            record.setdefault(TAG_FIELDS[kind], span)
        if not record:
            self.skips.drop("no_entity")
            return None
        bad = [span for span in record.values() if not writable(span)]
        if bad:
            self.skips.skip("unwritable_span", row.where, f"span {bad[0]!r}")
            return None
        return Example(
            uid=self.example_uid(row), input=" ".join(tokens), target=conll_target(record)
        )

    @cached_property
    def vocabulary(self) -> dict[str, list[str]]:
        """Per type, the first spans of every kept sentence of every split, sorted."""
        values: dict[str, set[str]] = {field: set() for field in FIELDS}
        for pool in self.corpus.values():
            for ex in pool:
                for field, span in output_fields(ex.target).items():
                    if span:
                        values[field].add(span)
        return {field: sorted(spans) for field, spans in values.items()}

    def vocab_size(self) -> int:
        return sum(map(len, self.vocabulary.values()))

    def pick_fewshot(self, pool: list[Example], k: int) -> list[Example]:
        """k prose sentences of 8-30 tokens, each with 1-3 entity types, chosen in a seeded
        order so that every type appears about 3 times and some fields stay empty."""

        def fields_of(ex: Example) -> list[str]:
            return [f for f, span in output_fields(ex.target).items() if span]

        def sentence_like(text: str) -> bool:  # prose, not a headline, table row or list
            words = text.split()
            lower = sum(word.isalpha() and word.islower() for word in words)
            return (
                8 <= len(words) <= 30
                and words[-1] == "."
                and lower >= len(words) / 2
                and text.isascii()
                and '"' not in text
            )

        candidates = [ex for ex in pool if sentence_like(ex.input) and len(fields_of(ex)) <= 3]
        random.Random(self.seed).shuffle(candidates)
        need = {field: 3 for field in FIELDS}
        chosen = []
        for ex in candidates:
            if any(need[f] > 0 for f in fields_of(ex)):
                chosen.append(ex)
                for f in fields_of(ex):
                    need[f] -= 1
            if len(chosen) == k:
                return chosen
        taken = {ex.uid for ex in chosen}
        return chosen + [ex for ex in candidates if ex.uid not in taken][: k - len(chosen)]

    # ----- hints and prompt -------------------------------------------------------------
    def hint_vocabularies(self) -> dict[str, list[str]]:
        return self.vocabulary

    def context(self, example: Example) -> str:
        hints = self.hints(example)
        if not hints:
            return ""
        lines = [f"{field}: {' | '.join(hints[field])}" for field in FIELDS if hints.get(field)]
        return "Similar entity spans:\n" + "\n".join(lines)

    # ----- grammar, parsing, scoring ----------------------------------------------------
    @cached_property
    def _grammar(self) -> str:
        # One terminal per field: "" or a vocabulary span, the space after ":" inside it.
        parts = []
        for i, field in enumerate(FIELDS):
            key = ("{" if i == 0 else ", ") + json_string(field) + ":"
            parts.append(f"{lark_literal(key)} {field.upper()}")
        lines = [f"start: {' '.join(parts)} {lark_literal('}')}"]
        for field in FIELDS:
            values = [" " + json_string(v) for v in ("", *self.vocabulary[field])]
            lines.append(f"{field.upper()}: {alternation(values)}")
        return "\n".join(lines) + "\n"

    def grammar(self) -> str:
        return self._grammar

    @cached_property
    def _vocabulary_sets(self) -> dict[str, frozenset[str]]:
        return {field: frozenset(spans) for field, spans in self.vocabulary.items()}

    def parse(self, output: str) -> dict[str, str]:
        value = _json_object(output)
        if tuple(value) != FIELDS:
            raise ValueError(KEY_ORDER)
        for field, span in value.items():
            known = isinstance(span, str) and (span == "" or span in self._vocabulary_sets[field])
            if not known:  # a list or object is not a span either (and is unhashable)
                raise ValueError(f"{field}: {span!r} is not in the {field} vocabulary")
        return value

    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        parsed = [self.try_parse(p) for p in predictions]
        golds = [output_fields(ex.target) for ex in examples]
        counts = entity_prf(parsed, golds, FIELDS)
        per_example = []
        for ex, p, g in zip(examples, parsed, golds):
            item = entity_prf([p], [g], FIELDS)["micro"]
            per_example.append(
                {"uid": ex.uid, "valid": p is not None, "tp": item.tp, "fp": item.fp, "fn": item.fn}
            )
        return Scores(
            metric=self.metric_name,
            value=counts["micro"].f1,
            per_example=per_example,
            details={
                **{name: prf.as_dict() for name, prf in counts.items()},
                "empty_field_rate": empty_field_rate(predictions, [ex.target for ex in examples]),
            },
            validity=validity_rate([p is not None for p in parsed]),
        )

    def search_penalty(self, example: Example, text: str, complete: bool) -> float:
        return field_penalty(example.input, closed_fields(text))
