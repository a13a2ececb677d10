"""`task=custom`: a structured-output task defined from configuration alone.

    python -m grammarrl.run task=custom task.spec=examples/support_tickets/task.yaml

`conf/task/custom.yaml` documents every key. A spec file (`task.spec`) holds any task key; its
relative paths are read from its directory, a data file written `<data>/PATH` or `<cache>/PATH`
from data.dir or cache_dir (`custom_spec.ROOTS`). The keys can also be given inline. The spec is
merged into `cfg.task` and checked by `resolve_spec`, which `grammarrl.job.validate` calls
before any model or data is loaded: unknown keys, missing files, none or two output constraints,
a schema, regex or Lark grammar that llguidance cannot compile (its message), a bad metric.
`CustomTask` then reads the rows when it is built (still before any model is loaded): a row
without the input field stops with `file:line`; gold outputs the grammar rejects are counted and
warned about.

Output constraints, compiled by llguidance through a Lark source as the built-in grammars are:
`json_schema` (`start: %json {...}`, one-line JSON with ", " and ": ", keys in schema order),
`regex` (`start: /.../`), `lark` (as given), `choices` (an alternation of string literals).
Python users can take the schema from a Pydantic model: `custom_spec.json_schema_of(MyModel)`.

Training reads inputs only: rows without a gold output are used, and a task without any gold
output trains; its metric is then reported as `<metric>_unavailable`, NaN.

This module holds the task class; the spec is read and checked in `custom_spec`, the constraint
compiled in `custom_grammar`, rows read in `custom_data`; the metrics are in `custom_metrics`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Self

from omegaconf import DictConfig

from grammarrl.data.sources import Row, fingerprint
from grammarrl.data.splits import partition
from grammarrl.errors import ConfigError, DataError
from grammarrl.tasks import task_class
from grammarrl.tasks.common import CorpusTask, clean_text
from grammarrl.tasks.custom_data import order_keys, read_table
from grammarrl.tasks.custom_grammar import ByteGrammarChecker
from grammarrl.tasks.custom_metrics import exact_match, json_fields_prf
from grammarrl.tasks.custom_spec import CUSTOM_KEYS, CustomSpec, resolve_spec
from grammarrl.tasks.metrics import corpus_bleu, validity_rate
from grammarrl.tasks.settings import TaskSettings
from grammarrl.types import Example, Scores

log = logging.getLogger(__name__)


def is_custom(task_cfg: Mapping[str, Any]) -> bool:
    """A task config of a task defined from configuration (`task=custom`, or renamed by a spec)."""
    return issubclass(task_class(task_cfg), CustomTask)


def check_task_keys(cfg: DictConfig) -> CustomSpec | None:
    """`config.validate`'s hook: a custom task's spec is merged and checked (`resolve_spec`); a
    built-in task must keep its name and not set the keys only custom tasks read."""
    cls = task_class(cfg.task)
    if issubclass(cls, CustomTask):
        return resolve_spec(cfg)
    if cfg.task.name != cls.name:
        raise ConfigError(
            f"task.name={cfg.task.name!r} is invalid for task={cls.name} (its "
            f"name is {cls.name!r}); a task of your own is task=custom"
        )
    for key in CUSTOM_KEYS:
        if cfg.task.get(key) is not None:
            raise ConfigError(
                f"task.{key} is read by task=custom only, not by task={cfg.task.name}"
            )
    return None


class CustomTask(CorpusTask):
    """A task read from `task.*` (after `resolve_spec`): the files, the grammar, the prompts of
    `CorpusTask` (instruction + output format, demonstrations as chat turns, the query; the
    reverse prompt swaps them) and the configured metric."""

    name = "custom"

    def __init__(self, settings: TaskSettings, spec: CustomSpec) -> None:
        self.spec = spec
        self.name = spec.name
        super().__init__(settings)
        self.instruction = self.spec.instruction
        self.output_format = self.spec.output_format
        self.inverse_instruction = self.spec.reverse_instruction
        self.checker = ByteGrammarChecker(self.spec.grammar)
        for line in self.spec.overrides:
            log.info("%s", line)
        self.splits()  # read now: a bad row stops the run before any model is loaded
        self.gold_rejected = self.check_gold()

    @property
    def metric_name(self) -> str:
        return self.spec.metric if self.has_gold else f"{self.spec.metric}_unavailable"

    @property
    def data_key(self) -> str:
        return fingerprint(
            self.name, sorted((k, str(p)) for k, p in self.spec.files.items()), self.spec.grammar
        )

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Self:
        """The task of a composed config: its spec merged into `cfg.task` and checked first."""
        spec = resolve_spec(cfg)
        return cls(TaskSettings.from_config(cfg), spec)

    # ----- data -------------------------------------------------------------------------
    def locate(self, settings: TaskSettings) -> tuple[str, Path | None]:
        """Its own files (`resolve_spec` refused another data.source): rooted at task.train's
        directory, which example ids are relative to."""
        return "local", self.spec.files["train"].parent

    def read_local(self, directory: Path) -> list[Row]:
        """The rows of the spec's train/dev/test files (split = the key)."""
        return [
            Row(split, record, where)
            for split in ("train", "dev", "test")
            if split in self.spec.files
            for record, where in read_table(self.spec.files[split])
        ]

    def read_rows(self) -> list[Row]:
        return self.read_local(self.root)

    def normalise(self, row: Row) -> Example:
        """The row's input (whitespace collapsed) and canonical gold output ("" when it has
        none). A missing or empty input is a DataError naming the row."""
        field = self.spec.input_field
        value = row.fields.get(field)
        text = clean_text(str(value)) if isinstance(value, (str, int, float)) else ""
        if not text:
            raise DataError(
                f"{row.where}: no {field!r} (task.input_field) in this row "
                f"(fields: {', '.join(map(str, row.fields)) or 'none'})"
            )
        return Example(uid=self.example_uid(row), input=text, target=self.gold(row))

    def gold(self, row: Row) -> str:
        """The row's gold output in the grammar's canonical form, "" if it has none."""
        value = row.fields.get(self.spec.output_field) if self.spec.output_field else None
        if value is None or value == "":
            return ""
        if self.spec.kind != "json_schema":
            return str(value)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"{row.where}: {self.spec.output_field!r} (task.output_field) is "
                    f"not JSON: {err}"
                ) from None
        schema = self.spec.schema or {}
        defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
        return json.dumps(order_keys(value, schema, defs), ensure_ascii=False)

    @cached_property
    def examples(self) -> dict[str, list[Example]]:
        """Every row of the files as an Example, by file (train, dev, test)."""
        pools: dict[str, list[Example]] = {}
        for row in self.read_rows():
            pools.setdefault(row.split, []).append(self.normalise(row))
        return pools

    @cached_property
    def corpus(self) -> dict[str, list[Example]]:
        """The labelled examples by file, demonstrations included (what `mode=prepare` checks)."""
        pools = {split: [ex for ex in pool if ex.target] for split, pool in self.examples.items()}
        if "demonstrations" in self.spec.files:
            pools["demonstrations"] = list(self.demonstration_pool)
        return pools

    @property
    def has_gold(self) -> bool:
        return any(ex.target for pool in self.examples.values() for ex in pool)

    @cached_property
    def demonstration_pool(self) -> tuple[Example, ...]:
        """The first num_fewshot rows of task.demonstrations (all labelled), else the first
        num_fewshot labelled training rows (in file order)."""
        k = self.settings.num_fewshot
        path = self.spec.files.get("demonstrations")
        if path is None:
            test = {ex.input for ex in self.examples.get("test", [])}
            train = self.examples.get("train", [])
            return tuple([ex for ex in train if ex.target and ex.input not in test][:k])
        demos = [
            self.normalise(Row("demonstrations", record, where))
            for record, where in read_table(path)[:k]
        ]
        for ex in demos:
            if not ex.target:
                raise DataError(
                    f"{ex.uid}: a demonstration needs its output "
                    f"({self.spec.output_field!r}, task.output_field)"
                )
        return tuple(demos)

    def pick_fewshot(self, pool: list[Example], k: int) -> list[Example]:
        return list(self.demonstration_pool[:k])

    def pools(self) -> dict[str, list[Example]]:
        """train/dev/test pools: the given files; without a dev file, task.dev_size of train's
        rows (at most a tenth) held out first; without a test file, then task.test_fraction of
        the labelled rows left (of all of them when none is labelled) (`splits.partition`)."""
        demos = {ex.uid for ex in self.demonstration_pool}
        train = [ex for ex in self.examples.get("train", []) if ex.uid not in demos]
        if "dev" in self.spec.files:
            dev = self.examples.get("dev", [])
        else:
            parts = partition(train, self.settings.dev_size, 0.0, self.seed)
            dev, train = parts["dev"], parts["train"]
        if "test" in self.spec.files:
            given = self.examples.get("test", [])
            test = [ex for ex in given if ex.target] or given
            self.skips.drop("unlabelled_test_row", len(given) - len(test))
        else:
            pool = [ex for ex in train if ex.target] or train
            test = partition(pool, 0, self.settings.test_fraction, self.seed)["test"]
            held = {ex.uid for ex in test}
            train = [ex for ex in train if ex.uid not in held]
        if not dev:
            where = "task.dev" if "dev" in self.spec.files else "train (at most a tenth of it)"
            raise DataError(
                f"{self.name}: no dev inputs from {where}: calibration and "
                "validation need some; give task.dev a file of inputs"
            )
        return {"train": train, "dev": dev, "test": test}

    def check_gold(self) -> tuple[int, int]:
        """(rejected, total) distinct gold outputs (demonstrations included) under the grammar,
        warned about with the first row that holds one: those can never be predicted exactly."""
        where = {ex.target: ex.uid for pool in self.corpus.values() for ex in pool}
        rejected = self.checker.rejected(where)
        if rejected:
            log.warning(
                "%s: the task grammar (task.%s) rejects %d of %d distinct gold outputs; "
                "those examples cannot be predicted exactly (first: %s: %r)",
                self.name,
                self.spec.kind,
                len(rejected),
                len(where),
                where[rejected[0]],
                rejected[0][:200],
            )
        if not self.has_gold:
            log.warning(
                "%s: no row has a gold output (task.output_field=%s): training needs "
                "none, but the metric %s is unavailable: results report %s as NaN "
                "(validity and predictions are still written)",
                self.name,
                self.spec.output_field,
                self.spec.metric,
                self.metric_name,
            )
        return len(rejected), len(where)

    def vocab_size(self) -> int:
        """The number of choices; 0 for the other constraints (no closed vocabulary)."""
        return len(self.spec.choices)

    # ----- grammar, parsing, scoring ----------------------------------------------------
    def grammar(self) -> str:
        return self.spec.grammar

    def parse(self, output: str) -> Any:
        """The output (a JSON value for json_schema); ValueError unless the grammar accepts it."""
        if not self.checker.accepts(output):
            raise ValueError(f"not accepted by the task grammar (task.{self.spec.kind})")
        return json.loads(output) if self.spec.kind == "json_schema" else output

    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        """The metric over the labelled examples (NaN when none is); validity over all."""
        parsed = [self.try_parse(p) for p in predictions]
        labelled = [i for i, ex in enumerate(examples) if ex.target]
        per_example = [
            {"uid": ex.uid, "valid": p is not None, "labelled": bool(ex.target)}
            for ex, p in zip(examples, parsed, strict=True)
        ]
        preds = [parsed[i] for i in labelled]
        golds = [self.parse_gold(examples[i].target) for i in labelled]
        details: dict[str, Any] = {"labelled": len(labelled)}
        metric = self.spec.metric
        if not labelled:
            value = math.nan
        elif metric in ("exact_match", "accuracy"):
            correct = exact_match(preds, golds)
            value = sum(correct) / len(correct)
            for i, ok in zip(labelled, correct):
                per_example[i]["correct"] = ok
        elif metric == "json_fields_f1":
            names = list((self.spec.schema or {}).get("properties", {})) or None
            counts = json_fields_prf(preds, golds, names)
            value = counts["micro"].f1
            details.update({name: prf.as_dict() for name, prf in counts.items()})
            for i in labelled:
                item = json_fields_prf([parsed[i]], [self.parse_gold(examples[i].target)], names)[
                    "micro"
                ]
                per_example[i].update(tp=item.tp, fp=item.fp, fn=item.fn)
        else:  # bleu
            value = corpus_bleu(
                [predictions[i] if parsed[i] is not None else "" for i in labelled],
                [examples[i].target for i in labelled],
            )
        return Scores(
            metric=self.metric_name,
            value=value,
            per_example=per_example,
            details=details,
            validity=validity_rate([p is not None for p in parsed]),
        )

    def parse_gold(self, target: str) -> Any:
        """A gold output as the metric compares it (JSON decoded for json_schema)."""
        return json.loads(target) if self.spec.kind == "json_schema" else target
