"""Readers for the local layout under `data.dir` (the formats of ../shared/data).

aslg_pc12/ENG-ASL_{Train,Dev,test}_0.046.{en,asl}   line i of .en pairs with line i of .asl
conll2003/{train,valid,test}.txt                     CoNLL columns, IOB2 tags in the last one
wos/wos_labelled.jsonl                               {"abstract", "parent", "child", ...}
wos/label_counts_raw_145.json                        {parent: {child: count}}: the label space
"""

from __future__ import annotations

import json
from pathlib import Path

from grammarrl.data.sources import Row, SkipLog, read_lines, read_text
from grammarrl.errors import DataError

ASLG_FILES = {
    "train": "ENG-ASL_Train_0.046",
    "dev": "ENG-ASL_Dev_0.046",
    "test": "ENG-ASL_test_0.046",
}
CONLL_FILES = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}
CONLL_TYPES = ("PER", "ORG", "LOC", "MISC")
WOS_FILE = "wos_labelled.jsonl"
WOS_LABELS = "label_counts_raw_145.json"


def read_aslg(directory: Path, skips: SkipLog) -> list[Row]:
    """English/gloss pairs from the corpus' own train/dev/test split files."""
    rows = []
    for split, stem in ASLG_FILES.items():
        en_path, asl_path = directory / f"{stem}.en", directory / f"{stem}.asl"
        english, gloss = read_lines(en_path), read_lines(asl_path)
        if len(english) != len(gloss):
            raise DataError(
                f"{en_path} has {len(english)} lines but {asl_path} has {len(gloss)}: "
                "line i of the .en file must pair with line i of the .asl file"
            )
        for number, (text, glossed) in enumerate(zip(english, gloss), start=1):
            rows.append(Row(split, {"text": text, "gloss": glossed}, f"{en_path}:{number}"))
    return rows


def read_conll(directory: Path, skips: SkipLog) -> list[Row]:
    """Sentences of the IOB2 CoNLL files: fields `tokens` and `tags`, located at their first line."""
    rows = []
    for split, name in CONLL_FILES.items():
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
    return tag == "O" or (tag[:2] in ("B-", "I-") and tag[2:] in CONLL_TYPES)


def read_wos(directory: Path, skips: SkipLog) -> list[Row]:
    """The labelled WoS pool (one split, `all`): fields `abstract`, `parent`, `child`."""
    path = directory / WOS_FILE
    rows = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            skips.skip("malformed_json", where, str(err))
            continue
        if not isinstance(record, dict):
            skips.skip("malformed_json", where, "not a JSON object")
            continue
        rows.append(Row("all", record, where))
    return rows


def read_wos_labels(directory: Path) -> dict[str, list[str]]:
    """The label space {parent: [children]} (order kept) from label_counts_raw_145.json."""
    path = directory / WOS_LABELS
    try:
        table = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(table, dict) or not all(isinstance(v, (dict, list)) for v in table.values()):
        raise DataError(f"{path}: expected {{parent: {{child: count}}}}")
    return {str(parent): [str(child) for child in children] for parent, children in table.items()}
