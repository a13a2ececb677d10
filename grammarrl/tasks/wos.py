"""Web of Science hierarchical classification. Output: {"parent": p, "child": c}.

The label space is the raw WOS-46985 one (7 parents, 145 parent-child paths; two child names
occur under two parents), read from label_counts_raw_145.json. The grammar admits only the
children of the parent just emitted. Metric: hierarchical F1. Files: wos/wos_labelled.jsonl
({"abstract", "parent", "child", ...} per line) and wos/label_counts_raw_145.json
({parent: {child: count}}: the label space). No public hub dataset carries the label names.
"""

from __future__ import annotations

import json
import random
from functools import cached_property
from pathlib import Path

from grammarrl.data.sources import Row, SkipLog, read_lines, read_text, task_dir
from grammarrl.data.splits import partition
from grammarrl.errors import DataError
from grammarrl.tasks.common import CorpusTask, clean_text
from grammarrl.tasks.grammar_check import alternation, json_string, lark_literal
from grammarrl.tasks.metrics import hierarchical_prf, validity_rate
from grammarrl.types import Example, Scores

RECORDS = "wos_labelled.jsonl"
LABELS = "label_counts_raw_145.json"


def read_wos(directory: Path, skips: SkipLog) -> list[Row]:
    """The labelled WoS pool (one split, `all`): fields `abstract`, `parent`, `child`."""
    path = directory / RECORDS
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
    path = directory / LABELS
    try:
        table = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(table, dict) or not all(isinstance(v, (dict, list)) for v in table.values()):
        raise DataError(f"{path}: expected {{parent: {{child: count}}}}")
    return {str(parent): [str(child) for child in children] for parent, children in table.items()}


def wos_target(parent: str, child: str) -> str:
    """The canonical output string: `{"parent": "CS", "child": "Machine learning"}`."""
    return json.dumps({"parent": parent, "child": child}, ensure_ascii=False)


class WosTask(CorpusTask):
    name = "wos"
    metric_name = "hierarchical_f1"
    table_label = "WoS (Hier. F1)"
    data_dir = "wos"
    instruction = (
        "Classify the abstract into one parent-child path of the hierarchy. "
        "Use labels from the hierarchy only."
    )
    output_format = 'Output format: {"parent": "<parent label>", "child": "<child label>"}'
    inverse_instruction = (
        "Given the classification JSON, reconstruct the original abstract as it was actually "
        "written. Output only that text."
    )

    @cached_property
    def hierarchy(self) -> dict[str, list[str]]:
        """{parent: [children]} in the label file's order."""
        if self.root is None:
            self.read_hub()  # raises: no hub source carries the label names
        return read_wos_labels(task_dir(self.root, self.data_dir, self.name))

    @cached_property
    def _paths(self) -> frozenset[tuple[str, str]]:
        return frozenset((p, c) for p, children in self.hierarchy.items() for c in children)

    def read_local(self, directory: Path) -> list[Row]:
        return read_wos(directory, self.skips)

    def read_hub(self) -> list[Row]:
        raise DataError(
            f"task {self.name}: no public hub dataset carries the WoS label names; put "
            f"{RECORDS} and {LABELS} under data.dir/{self.data_dir} (see docs/builtin-tasks.md) and use "
            "data.source=local"
        )

    def normalise(self, row: Row) -> Example | None:
        fields = row.fields
        values = [fields.get(key) for key in ("abstract", "parent", "child")]
        if not all(isinstance(v, str) for v in values):
            self.skips.skip("missing_field", row.where, "needs abstract, parent and child")
            return None
        abstract, parent, child = clean_text(values[0]), values[1].strip(), values[2].strip()
        if not abstract:
            self.skips.skip("empty_text", row.where)
            return None
        if (parent, child) not in self._paths:
            self.skips.skip("label_outside_hierarchy", row.where, f"{parent} / {child}")
            return None
        return Example(uid=self.example_uid(row), input=abstract, target=wos_target(parent, child))

    def pools(self) -> dict[str, list[Example]]:
        """One labelled pool, split with a fixed seed (dev, then test_fraction of the rest)."""
        pool = [ex for examples in self.corpus.values() for ex in examples]
        return partition(pool, self.settings.dev_size, self.settings.test_fraction, self.seed)

    def vocab_size(self) -> int:
        return len(self._paths)

    def pick_fewshot(self, pool: list[Example], k: int) -> list[Example]:
        """k abstracts of 80-200 words with distinct parents, in a seeded order."""
        candidates = [ex for ex in pool if 80 <= len(ex.input.split()) <= 200]
        random.Random(self.seed).shuffle(candidates)
        chosen: list[Example] = []
        parents: set[str] = set()
        for ex in candidates:
            parent = json.loads(ex.target)["parent"]
            if parent not in parents:
                chosen.append(ex)
                parents.add(parent)
                if len(chosen) == k:
                    break
        return chosen

    def context(self, example: Example) -> str:
        lines = [f"{parent}: {'; '.join(children)}" for parent, children in self.hierarchy.items()]
        return "Label hierarchy (parent: children):\n" + "\n".join(lines)

    # ----- grammar, parsing, scoring ----------------------------------------------------
    @cached_property
    def _grammar(self) -> str:
        # One terminal per parent holds its children (with the leading space inside).
        parents = list(self.hierarchy)
        branches = " | ".join(
            f"{lark_literal(' ' + json_string(p) + ', ' + json_string('child') + ':')} CHILD_{i}"
            for i, p in enumerate(parents)
        )
        lines = [
            f"start: {lark_literal('{' + json_string('parent') + ':')} path {lark_literal('}')}",
            f"path: {branches}",
        ]
        for i, parent in enumerate(parents):
            children = [" " + json_string(child) for child in self.hierarchy[parent]]
            lines.append(f"CHILD_{i}: {alternation(children)}")
        return "\n".join(lines) + "\n"

    def grammar(self) -> str:
        return self._grammar

    def parse(self, output: str) -> tuple[str, str]:
        try:
            value = json.loads(output)
        except json.JSONDecodeError as err:
            raise ValueError(f"not JSON: {err}") from None
        if not isinstance(value, dict) or list(value) != ["parent", "child"]:
            raise ValueError('expected {"parent": ..., "child": ...}')
        path = (value["parent"], value["child"])
        if not all(isinstance(label, str) for label in path) or path not in self._paths:
            raise ValueError(f"not a path of the hierarchy: {path}")
        return path

    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        parsed = [self.try_parse(p) for p in predictions]
        golds = [self.parse(ex.target) for ex in examples]
        counts = hierarchical_prf(parsed, golds)
        per_example = [
            {
                "uid": ex.uid,
                "valid": p is not None,
                "parent_correct": p is not None and p[0] == g[0],
                "path_correct": p == g,
            }
            for ex, p, g in zip(examples, parsed, golds)
        ]
        return Scores(
            metric=self.metric_name,
            value=counts.f1,
            per_example=per_example,
            details=counts.as_dict(),
            validity=validity_rate([p is not None for p in parsed]),
        )
