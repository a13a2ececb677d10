"""`task=custom`: a structured-output task defined from configuration alone.

    python -m grammarrl.run task=custom task.spec=examples/support_tickets/task.yaml

`conf/task/custom.yaml` documents every key. A spec file (`task.spec`) holds any task key; its
relative paths are read from its directory. The keys can also be given inline. The spec is
merged into `cfg.task` and checked by `resolve_spec`, which `grammarrl.config.validate` calls
before any model or data is loaded: unknown keys, missing files, none or two output constraints,
a schema, regex or Lark grammar that llguidance cannot compile (its message), a bad metric.
`CustomTask` then reads the rows when it is built (still before any model is loaded): a row
without the input field stops with `file:line`; gold outputs the grammar rejects are counted and
warned about.

Output constraints, compiled by llguidance through a Lark source as the built-in grammars are:
`json_schema` (`start: %json {...}`, one-line JSON with ", " and ": ", keys in schema order),
`regex` (`start: /.../`), `lark` (as given), `choices` (an alternation of string literals).
Python users can take the schema from a Pydantic model: `json_schema_of(MyModel)`.

Training reads inputs only: rows without a gold output are used, and a task without any gold
output trains; its metric is then reported as `<metric>_unavailable`, NaN.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, ClassVar

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from grammarrl.config import TaskSchema, unknown_key_error
from grammarrl.data.sources import Row, SkipLog, fingerprint, read_lines, read_text
from grammarrl.data.splits import partition
from grammarrl.errors import ConfigError, DataError
from grammarrl.metrics import corpus_bleu, entity_prf, validity_rate
from grammarrl.tasks import builtin_task_names, task_class
from grammarrl.tasks.common import CorpusTask, clean_text
from grammarrl.tasks.grammar_check import GrammarChecker, alternation
from grammarrl.types import Example, Scores

log = logging.getLogger(__name__)

DEFAULTS_FILE = Path(__file__).resolve().parents[2] / "conf" / "task" / "custom.yaml"
CONSTRAINTS = ("json_schema", "regex", "lark", "choices")
METRICS = ("exact_match", "accuracy", "json_fields_f1", "bleu")
AUTO_METRIC = {"json_schema": "json_fields_f1", "choices": "accuracy"}  # else exact_match
FILE_KEYS = ("train", "dev", "test", "demonstrations")
CUSTOM_KEYS = ("spec", *FILE_KEYS, "input_field", "output_field", *CONSTRAINTS, "instruction",
               "output_format", "reverse_instruction")
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": ",", ".tsv": "\t"}
# One-line JSON in the separators of json.dumps: the canonical gold form, natural BPE tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NAME = re.compile(r"[A-Za-z0-9_.-]+")
REVERSE_INSTRUCTION = (
    "Given the output of the task below, reconstruct the original input as it was actually "
    "written. Output only that input.\n\nTask: {instruction}"
)


def json_schema_of(model: type) -> dict[str, Any]:
    """The JSON schema of a Pydantic model class, for `task.json_schema` (Python users):
    `cfg.task.json_schema = json_schema_of(Ticket)`, or write it to a file the spec names."""
    return model.model_json_schema()


# ---------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class CustomSpec:
    """A checked custom task: absolute files, the constraint as a Lark source, prompts, metric."""

    name: str
    files: dict[str, Path]  # train, and those of dev, test, demonstrations that are given
    input_field: str
    output_field: str | None
    kind: str  # one of CONSTRAINTS
    grammar: str  # the Lark source llguidance compiles
    schema: dict[str, Any] | None  # json_schema only, as given (objects not yet closed)
    choices: tuple[str, ...]
    metric: str
    instruction: str
    output_format: str
    reverse_instruction: str


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
        raise ConfigError(f"task.name={cfg.task.name!r} is invalid for task={cls.name} (its "
                          f"name is {cls.name!r}); a task of your own is task=custom")
    for key in CUSTOM_KEYS:
        if cfg.task.get(key) is not None:
            raise ConfigError(f"task.{key} is read by task=custom only, not by "
                              f"task={cfg.task.name}")
    return None


def resolve_spec(cfg: DictConfig) -> CustomSpec:
    """Merge `task.spec` into `cfg.task` (in place; idempotent) and check the custom task.
    Raises ConfigError naming the key (and the spec file) on any bad value."""
    task = cfg.task
    name = str(task.get("name"))
    if task.get("spec") is None and task.get("train") is None:
        if name == "custom":
            raise ConfigError("task=custom needs task.spec=FILE (a YAML file defining the task) "
                              "or its keys inline, task.train=... at least (conf/task/custom.yaml)")
        raise ConfigError(f"task={name!r} is invalid: expected one of "
                          f"{', '.join(builtin_task_names())}, or custom (task=custom "
                          "task.spec=FILE)")
    if task.get("spec") is not None:
        merge_spec_file(task)
    source = str(cfg.get("data", {}).get("source", "local"))
    if source != "local":
        raise ConfigError(f"data.source={source}: a custom task reads its own files "
                          "(task.train, task.dev, task.test); leave data.source=local")
    return build_spec(task)


def _spec_defaults() -> DictConfig:
    return OmegaConf.load(DEFAULTS_FILE)


def merge_spec_file(task: DictConfig) -> None:
    """Copy the spec file's keys into `task`. A key that `task` already holds with a value other
    than conf/task/custom.yaml's default (given on the command line) keeps it. Relative paths of
    the file are made absolute from its directory."""
    path = Path(str(task.spec)).expanduser()
    if not path.is_file():
        raise ConfigError(f"task.spec={task.spec}: no such file (a YAML file holding the task's "
                          "keys, see conf/task/custom.yaml)")
    try:
        values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (yaml.YAMLError, OmegaConfBaseException) as err:  # syntax, interpolation
        raise ConfigError(f"task.spec={path}: not a readable YAML file: {err}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"task.spec={path}: expected a mapping of task keys, got "
                          f"{type(values).__name__}")
    known = {f.name for f in fields(TaskSchema)} - {"spec"}
    defaults = _spec_defaults()
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"task.spec={path}: {unknown_key_error(f'task.{key}')}")
        value = _from_spec_dir(key, value, path.parent)
        current = task.get(key)
        if current is not None and current != defaults.get(key):
            if _plain(current) != value:
                log.info("task.%s=%s (command line) overrides %s's %r", key, current, path, value)
            continue
        with open_dict(task):
            task[key] = value


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _from_spec_dir(key: str, value: Any, directory: Path) -> Any:
    """A spec file's value with a relative file path made absolute from `directory`."""
    is_path = (key in FILE_KEYS
               or (key == "json_schema" and isinstance(value, str)
                   and not value.lstrip().startswith("{"))
               or (key == "lark" and isinstance(value, str) and _is_lark_file(value)))
    if is_path and isinstance(value, str) and not Path(value).expanduser().is_absolute():
        return str((directory / value).resolve())
    return value


def _is_lark_file(value: str) -> bool:
    return "\n" not in value and value.strip().endswith(".lark")


def _existing_file(task: DictConfig, key: str) -> Path:
    value = task.get(key)
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise ConfigError(f"task.{key}={value}: no such file")
    return path.resolve()


def _text(task: DictConfig, key: str, default: str | None = None) -> str | None:
    value = task.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigError(f"task.{key}={value!r} is invalid: expected a string")
    return value


def build_spec(task: DictConfig) -> CustomSpec:
    """Check a merged custom task config and compile its constraint (no tokenizer needed)."""
    name = str(task.name)
    builtins = builtin_task_names()
    if not NAME.fullmatch(name) or name in builtins:
        raise ConfigError(f"task.name={name!r} is invalid for a custom task: expected letters, "
                          f"digits, _ . - and not a built-in task's name ({', '.join(builtins)})")
    if task.get("train") is None:
        raise ConfigError("task.train is required: the JSONL or CSV file of training inputs")
    files = {key: _existing_file(task, key) for key in FILE_KEYS if task.get(key) is not None}
    for key, path in files.items():
        if path.suffix.lower() not in FORMATS:
            raise ConfigError(f"task.{key}={task.get(key)}: expected a .jsonl, .ndjson, .csv or "
                              ".tsv file")
    input_field = _text(task, "input_field", "input")
    output_field = _text(task, "output_field")
    if not input_field:
        raise ConfigError("task.input_field is empty: name the field holding the input text")
    if output_field == input_field:
        raise ConfigError(f"task.output_field={output_field!r} is also task.input_field")
    if "demonstrations" in files and not output_field:
        raise ConfigError("task.demonstrations needs task.output_field (the field of their "
                          "outputs)")
    if int(task.get("num_hints") or 0) != 0:
        raise ConfigError(f"task.num_hints={task.num_hints}: hints are not supported for custom "
                          "tasks; set task.num_hints=0")

    given = [key for key in CONSTRAINTS if task.get(key) not in (None, "")]
    if len(given) != 1:
        keys = ", ".join(f"task.{key}" for key in (given or CONSTRAINTS))
        raise ConfigError(f"{keys}: a custom task needs exactly one output constraint "
                          f"({'none is set' if not given else 'several are set: keep one'})")
    kind = given[0]
    schema, choices, grammar, describe = _constraint(task, kind)
    check_lark(grammar, f"task.{kind}")

    metric = str(task.get("metric") or "auto")
    metric = AUTO_METRIC.get(kind, "exact_match") if metric == "auto" else metric
    if metric not in METRICS:
        raise ConfigError(f"task.metric={metric!r} is invalid: expected auto or one of "
                          f"{', '.join(METRICS)}")
    if metric == "json_fields_f1" and kind != "json_schema":
        raise ConfigError(f"task.metric=json_fields_f1 scores JSON fields: it needs "
                          f"task.json_schema, not task.{kind}")
    instruction = _text(task, "instruction")
    if not instruction:
        raise ConfigError("task.instruction is required: the system instruction that says what "
                          "to produce from the input")
    reverse = _text(task, "reverse_instruction") or REVERSE_INSTRUCTION.format(
        instruction=instruction)
    return CustomSpec(
        name=name, files=files, input_field=input_field, output_field=output_field or None,
        kind=kind, grammar=grammar, schema=schema, choices=choices, metric=metric,
        instruction=instruction, output_format=_text(task, "output_format", describe),
        reverse_instruction=reverse)


def _constraint(task: DictConfig, kind: str) -> tuple[dict | None, tuple[str, ...], str, str]:
    """(schema, choices, Lark source, default output-format line) of the given constraint."""
    value = _plain(task.get(kind))
    key = f"task.{kind}"
    if kind == "json_schema":
        schema = _schema(value, key)
        layout = {**JSON_LAYOUT, **schema.get("x-guidance", {})}
        source = json.dumps({**closed(schema), "x-guidance": layout}, ensure_ascii=False)
        shown = json.dumps({k: v for k, v in schema.items() if k != "x-guidance"},
                           ensure_ascii=False)
        return schema, (), f"start: %json {source}\n", (
            f"Output format: one JSON object on one line, matching this JSON schema: {shown}")
    if kind == "choices":
        if (not isinstance(value, list) or not value
                or not all(isinstance(c, str) and c for c in value)):
            raise ConfigError(f"{key}={value!r} is invalid: expected a list of non-empty strings")
        choices = tuple(dict.fromkeys(value))
        return None, choices, f"start: {alternation(choices)}\n", (
            f"Answer with exactly one of: {' | '.join(choices)}")
    if not isinstance(value, str):
        raise ConfigError(f"{key}={value!r} is invalid: expected a string")
    if kind == "regex":
        import llguidance

        return None, (), f"start: /{llguidance.regex_to_lark(value)}/\n", (
            f"Output format: text matching the regular expression {value}")
    if _is_lark_file(value):  # lark
        path = _existing_file(task, kind)
        return None, (), read_text(path), ""
    return None, (), value, ""


def _schema(value: Any, key: str) -> dict[str, Any]:
    """A JSON schema given inline (a mapping or JSON text) or as a file path."""
    if isinstance(value, str) and not value.lstrip().startswith("{"):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(f"{key}={value}: no such file (a JSON schema, or give it inline)")
        where, text = str(path), read_text(path)
    else:
        where, text = "inline", value
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{key} ({where}): not valid JSON: {err}") from None
    if not isinstance(text, dict):
        raise ConfigError(f"{key} ({where}): expected a JSON schema object, got "
                          f"{type(text).__name__}")
    return text


def closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` added to every object that lists its
    `properties` and says nothing about other keys (JSON Schema would allow any key there)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def check_lark(source: str, key: str) -> None:
    """ConfigError naming `key` with llguidance's message if the Lark source does not compile."""
    import llguidance

    spec = llguidance.LLMatcher.grammar_from_lark(source)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(spec, None)
    if is_error:
        raise ConfigError(f"{key}: llguidance cannot compile it: "
                          f"{one_line(messages[0] if messages else '?', key != 'task.lark')}")


def one_line(message: str, drop_position: bool) -> str:
    """llguidance's message on one line, without its excerpt of the grammar; the position
    (`at 1(8): `) is dropped where it points into the Lark source we generated."""
    lines = []
    for line in message.splitlines():
        if re.match(r"\s*\d+ \| ", line):  # the excerpt: `   1 | start: ...` and its caret
            break
        lines.append(line.strip())
    text = " ".join(line for line in lines if line)
    return re.sub(r"^at \d+\(\d+\): ", "", text) if drop_position else text


# ---------------------------------------------------------------------- acceptance by bytes


class ByteTokenizer:
    """Token i is byte i; token 256 ends the text. Lets llguidance check whole strings against
    a grammar without a model's tokenizer (the language a grammar accepts is over bytes)."""

    eos_token_id = 256
    bos_token_id = None
    special_token_ids: ClassVar[list[int]] = [256]
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<|end|>"]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))


@lru_cache(maxsize=1)
def _byte_ll_tokenizer() -> Any:
    import llguidance

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))


class ByteGrammarChecker(GrammarChecker):
    """`GrammarChecker` over bytes: accepts exactly the strings of the grammar's language."""

    def __init__(self, lark: str) -> None:
        import llguidance

        self.tokenizer = ByteTokenizer()
        spec = llguidance.grammar_from("lark", lark)
        self._start = llguidance.LLMatcher(_byte_ll_tokenizer(), spec, log_level=0)
        if self._start.is_error():
            raise ValueError(f"the grammar does not compile: {self._start.get_error()[:500]}")


# ---------------------------------------------------------------------- reading rows


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


def canonical(value: Any) -> str:
    """A JSON value's comparable form: keys sorted, no float/int/bool confusion."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# ---------------------------------------------------------------------- metrics


def exact_match(predictions: Sequence[Any], golds: Sequence[Any]) -> list[bool]:
    """Per example: the parsed prediction equals the parsed gold (JSON compared by value, with
    keys in any order; an invalid prediction, None, never matches)."""
    return [p is not None and canonical(p) == canonical(g) for p, g in zip(predictions, golds,
                                                                           strict=True)]


def field_values(value: Any) -> dict[str, str]:
    """A JSON object's fields as comparable strings; "" for an absent or empty field (null, "",
    [], {}); 0 and false are values. A non-object (or None) has no fields."""
    if not isinstance(value, dict):
        return {}
    return {k: "" if v in (None, "", [], {}) else canonical(v) for k, v in value.items()}


def json_fields_prf(predictions: Sequence[Any], golds: Sequence[Any],
                    field_names: Sequence[str] | None = None) -> dict[str, Any]:
    """The CoNLL rule (`metrics.entity_prf`) per JSON field: tp when the gold field is filled and
    the prediction equals it, fp when the prediction is filled and differs, fn when the gold is
    filled and the prediction differs. Fields: `field_names`, else every key of the golds."""
    gold_fields = [field_values(g) for g in golds]
    if field_names is None:
        field_names = list(dict.fromkeys(k for g in gold_fields for k in g))
    return entity_prf([field_values(p) for p in predictions], gold_fields, field_names)


# ---------------------------------------------------------------------- the task


class CustomTask(CorpusTask):
    """A task read from `task.*` (after `resolve_spec`): the files, the grammar, the prompts of
    `CorpusTask` (instruction + output format, demonstrations as chat turns, the query; the
    reverse prompt swaps them) and the configured metric."""

    name = "custom"

    def __init__(self, cfg: DictConfig) -> None:
        self.spec = resolve_spec(cfg)
        self.cfg, self.task_cfg = cfg, cfg.task
        self.name = self.spec.name
        self.labelled = bool(self.spec.output_field)
        self.instruction = self.spec.instruction
        self.output_format = self.spec.output_format
        self.inverse_instruction = self.spec.reverse_instruction
        self.source, self.root = "local", self.spec.files["train"].parent
        data = cfg.get("data") or {}
        self.seed = int(data.get("split_seed", 0))
        self.embedder = str(data.get("embedder") or "")
        self.cache_dir = Path(str(cfg.get("cache_dir") or Path.home() / ".cache" / "grammarrl"))
        self.skips = SkipLog(self.name)
        self._splits = None
        self._hints_ready = False
        self.checker = ByteGrammarChecker(self.spec.grammar)
        self.splits()  # read now: a bad row stops the run before any model is loaded
        self.gold_rejected = self.check_gold()

    @property
    def metric_name(self) -> str:
        return self.spec.metric if self.has_gold else f"{self.spec.metric}_unavailable"

    @property
    def data_key(self) -> str:
        return fingerprint(self.name, sorted((k, str(p)) for k, p in self.spec.files.items()),
                           self.spec.grammar)

    # ----- data -------------------------------------------------------------------------
    def read_local(self, directory: Path) -> list[Row]:
        """The rows of the spec's train/dev/test files (split = the key)."""
        return [Row(split, record, where) for split in ("train", "dev", "test")
                if split in self.spec.files
                for record, where in read_table(self.spec.files[split])]

    def read_rows(self) -> list[Row]:
        return self.read_local(self.root)

    def normalise(self, row: Row) -> Example:
        """The row's input (whitespace collapsed) and canonical gold output ("" when it has
        none). A missing or empty input is a DataError naming the row."""
        field = self.spec.input_field
        value = row.fields.get(field)
        text = clean_text(str(value)) if isinstance(value, (str, int, float)) else ""
        if not text:
            raise DataError(f"{row.where}: no {field!r} (task.input_field) in this row "
                            f"(fields: {', '.join(map(str, row.fields)) or 'none'})")
        return Example(uid=row.where, input=text, target=self.gold(row))

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
                raise DataError(f"{row.where}: {self.spec.output_field!r} (task.output_field) is "
                                f"not JSON: {err}") from None
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
        k = int(self.task_cfg.num_fewshot)
        path = self.spec.files.get("demonstrations")
        if path is None:
            test = {ex.input for ex in self.examples.get("test", [])}
            train = self.examples.get("train", [])
            return tuple([ex for ex in train if ex.target and ex.input not in test][:k])
        demos = [self.normalise(Row("demonstrations", record, where))
                 for record, where in read_table(path)[:k]]
        for ex in demos:
            if not ex.target:
                raise DataError(f"{ex.uid}: a demonstration needs its output "
                                f"({self.spec.output_field!r}, task.output_field)")
        return tuple(demos)

    def pick_fewshot(self, pool: list[Example], k: int) -> list[Example]:
        return list(self.demonstration_pool[:k])

    def pools(self) -> dict[str, list[Example]]:
        """train/dev/test pools: the given files; without a test file, task.test_fraction of
        train's labelled rows (of all its rows when none is labelled); without a dev file,
        task.dev_size rows held out of train (`splits.partition`)."""
        demos = {ex.uid for ex in self.demonstration_pool}
        train = [ex for ex in self.examples.get("train", []) if ex.uid not in demos]
        if "test" in self.spec.files:
            given = self.examples.get("test", [])
            test = [ex for ex in given if ex.target] or given
            self.skips.drop("unlabelled_test_row", len(given) - len(test))
        else:
            pool = [ex for ex in train if ex.target] or train
            test = partition(pool, 0, float(self.task_cfg.test_fraction), self.seed)["test"]
            held = {ex.uid for ex in test}
            train = [ex for ex in train if ex.uid not in held]
        if "dev" in self.spec.files:
            dev = self.examples.get("dev", [])
        else:
            parts = partition(train, int(self.task_cfg.dev_size), 0.0, self.seed)
            dev, train = parts["dev"], parts["train"]
        if not dev:
            where = "task.dev" if "dev" in self.spec.files else "train (at most a tenth of it)"
            raise DataError(f"{self.name}: no dev inputs from {where}: calibration and "
                            "validation need some; give task.dev a file of inputs")
        return {"train": train, "dev": dev, "test": test}

    def check_gold(self) -> tuple[int, int]:
        """(rejected, total) distinct gold outputs (demonstrations included) under the grammar,
        warned about with the first row that holds one: those can never be predicted exactly."""
        where = {ex.target: ex.uid for pool in self.corpus.values() for ex in pool}
        rejected = self.checker.rejected(where)
        if rejected:
            log.warning("%s: the task grammar (task.%s) rejects %d of %d distinct gold outputs; "
                        "those examples cannot be predicted exactly (first: %s: %r)", self.name,
                        self.spec.kind, len(rejected), len(where), where[rejected[0]],
                        rejected[0][:200])
        if not self.has_gold:
            log.warning("%s: no row has a gold output (task.output_field=%s): training needs "
                        "none, but the metric %s is unavailable: results report %s as NaN "
                        "(validity and predictions are still written)", self.name,
                        self.spec.output_field, self.spec.metric, self.metric_name)
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
        per_example = [{"uid": ex.uid, "valid": p is not None, "labelled": bool(ex.target)}
                       for ex, p in zip(examples, parsed, strict=True)]
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
                item = json_fields_prf([parsed[i]], [self.parse_gold(examples[i].target)],
                                       names)["micro"]
                per_example[i].update(tp=item.tp, fp=item.fp, fn=item.fn)
        else:  # bleu
            value = corpus_bleu([predictions[i] if parsed[i] is not None else "" for i in labelled],
                                [examples[i].target for i in labelled])
        return Scores(metric=self.metric_name, value=value, per_example=per_example,
                      details=details, validity=validity_rate([p is not None for p in parsed]))

    def parse_gold(self, target: str) -> Any:
        """A gold output as the metric compares it (JSON decoded for json_schema)."""
        return json.loads(target) if self.spec.kind == "json_schema" else target
