"""Reading the rows of `task=custom`'s files (JSONL, CSV, TSV) and putting gold JSON values in
the key order llguidance generates them in."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grammarrl.data.sources import read_lines, read_text
from grammarrl.errors import DataError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": ",", ".tsv": "\t"}


def read_table(path: Path) -> list[tuple[dict[str, Any], str]]:
    """(record, "file:line") of each row of a JSONL or CSV/TSV file; DataError naming the line
    of a row that is not a JSON object. Blank JSONL lines are passed over."""
    fmt = FORMATS[path.suffix.lower()]
    if fmt != "jsonl":
        reader = csv.DictReader(io.StringIO(read_text(path), newline=""), delimiter=fmt)
        rows, line = [], reader.line_num + 2  # the header is line 1
        try:
            for record in reader:
                rows.append((record, f"{path}:{line}"))
                line = reader.line_num + 1
        except csv.Error as err:
            raise DataError(f"{path}:{reader.line_num}: not valid CSV: {err}") from None
        return rows
    rows = []
    for number, text in enumerate(read_lines(path), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: not a JSON object: {err}") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: not a JSON object")
        rows.append((record, f"{path}:{number}"))
    return rows


def order_keys(value: Any, schema: Any, defs: Mapping[str, Any]) -> Any:
    """A JSON value with each object's keys in its schema's `properties` order (others after),
    following local `$ref`s: the order llguidance generates them in."""
    if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema, dict) else None
        return [order_keys(item, items, defs) for item in value]
    if not isinstance(value, dict):
        return value
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    keys = [k for k in props if k in value] + [k for k in value if k not in props]
    return {k: order_keys(value[k], props.get(k), defs) for k in keys}
