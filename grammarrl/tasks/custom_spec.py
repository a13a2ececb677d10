"""The spec of `task=custom`: reading `task.spec` into `cfg.task` and checking every key.

`resolve_spec` (called by `grammarrl.job.validate` through `custom.check_task_keys`, before
any model or data is loaded) merges the spec file and builds a `CustomSpec`: absolute files, the
output constraint compiled to a Lark source (`custom_grammar`), the prompts and the metric. Any bad
value is a ConfigError naming the key (and the spec file).

A data file (`FILE_KEYS`) is a path relative to the spec file's directory, an absolute path, or
one under a configured directory (`ROOTS`): `<data>/wos/wos_labelled.jsonl` is read from
`data.dir`, `<cache>/...` from `cache_dir`, so a spec can name a corpus outside the repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from grammarrl.config.checks import unknown_key_error
from grammarrl.config.schema import TaskSchema
from grammarrl.data.sources import read_text
from grammarrl.errors import ConfigError
from grammarrl.tasks import builtin_task_names
from grammarrl.tasks.custom_data import FORMATS
from grammarrl.tasks.custom_grammar import check_lark, constraint_grammar

DEFAULTS_FILE = Path(__file__).resolve().parents[2] / "conf" / "task" / "custom.yaml"
CONSTRAINTS = ("json_schema", "regex", "lark", "choices")
METRICS = ("exact_match", "accuracy", "json_fields_f1", "bleu")
AUTO_METRIC = {"json_schema": "json_fields_f1", "choices": "accuracy"}  # else exact_match
FILE_KEYS = ("train", "dev", "test", "demonstrations")
# A data file's path may start with one of these: a file under that configured directory.
ROOTS = {
    "<data>/": ("data.dir", "GRAMMARRL_DATA_DIR"),
    "<cache>/": ("cache_dir", "GRAMMARRL_CACHE_DIR"),
}
CUSTOM_KEYS = (
    "spec",
    *FILE_KEYS,
    "input_field",
    "output_field",
    *CONSTRAINTS,
    "instruction",
    "output_format",
    "reverse_instruction",
)
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
    overrides: tuple[str, ...] = ()  # "task.KEY=value (command line) overrides FILE's value"


def resolve_spec(cfg: DictConfig) -> CustomSpec:
    """Merge `task.spec` into `cfg.task` (in place; idempotent, silent: the task logs the
    spec's `overrides` once it is built) and check the custom task. Raises ConfigError naming
    the key (and the spec file) on any bad value."""
    task = cfg.task
    name = str(task.get("name"))
    if task.get("spec") is None and task.get("train") is None:
        if name == "custom":
            raise ConfigError(
                "task=custom needs task.spec=FILE (a YAML file defining the task) "
                "or its keys inline, task.train=... at least (conf/task/custom.yaml)"
            )
        raise ConfigError(
            f"task={name!r} is invalid: expected one of "
            f"{', '.join(builtin_task_names())}, or custom (task=custom "
            "task.spec=FILE)"
        )
    overrides = merge_spec_file(task) if task.get("spec") is not None else []
    source = str(cfg.get("data", {}).get("source", "local"))
    if source != "local":
        raise ConfigError(
            f"data.source={source}: a custom task reads its own files "
            "(task.train, task.dev, task.test); leave data.source=local"
        )
    roots = {prefix: OmegaConf.select(cfg, key) for prefix, (key, _) in ROOTS.items()}
    return replace(build_spec(task, roots), overrides=tuple(overrides))


def _spec_defaults() -> DictConfig:
    return OmegaConf.load(DEFAULTS_FILE)


def run_task_name(name: str, spec: str | None) -> str:
    """The task name in a run directory's name (`hydra.run.dir`, resolver `grammarrl.task_name`):
    a spec file's `name:` unless task.name was given, as `merge_spec_file` decides; `name`
    when there is no spec or it cannot be read (validation says why)."""
    if spec is None or name != _spec_defaults().name:
        return name
    try:
        values = OmegaConf.load(Path(spec).expanduser())
    except (OSError, yaml.YAMLError, OmegaConfBaseException):
        return name
    return str(values.get("name") or name) if isinstance(values, DictConfig) else name


def merge_spec_file(task: DictConfig) -> list[str]:
    """Copy the spec file's keys into `task`. A key that `task` already holds with a value other
    than conf/task/custom.yaml's default (given on the command line) keeps it: returned, one
    line each. Relative paths of the file are made absolute from its directory."""
    path = Path(str(task.spec)).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"task.spec={task.spec}: no such file (a YAML file holding the task's "
            "keys, see conf/task/custom.yaml)"
        )
    try:
        values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (yaml.YAMLError, OmegaConfBaseException) as err:  # syntax, interpolation
        raise ConfigError(f"task.spec={path}: not a readable YAML file: {err}") from None
    if not isinstance(values, dict):
        raise ConfigError(
            f"task.spec={path}: expected a mapping of task keys, got {type(values).__name__}"
        )
    known = {f.name for f in fields(TaskSchema)} - {"spec"}
    defaults = _spec_defaults()
    overrides = []
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"task.spec={path}: {unknown_key_error(f'task.{key}')}")
        value = _from_spec_dir(key, value, path.parent)
        current = task.get(key)
        if current is not None and current != defaults.get(key):
            if _plain(current) != value:
                overrides.append(
                    f"task.{key}={current} (command line) overrides {path}'s {value!r}"
                )
            continue
        with open_dict(task):
            task[key] = value
    return overrides


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _from_spec_dir(key: str, value: Any, directory: Path) -> Any:
    """A spec file's value with a relative file path made absolute from `directory` (a path
    under a `ROOTS` directory is kept as written)."""
    is_path = (
        key in FILE_KEYS
        or (key == "json_schema" and isinstance(value, str) and not value.lstrip().startswith("{"))
        or (key == "lark" and isinstance(value, str) and _is_lark_file(value))
    )
    relative = (
        isinstance(value, str)
        and not value.startswith(tuple(ROOTS))
        and not Path(value).expanduser().is_absolute()
    )
    return str((directory / value).resolve()) if is_path and relative else value


def _is_lark_file(value: str) -> bool:
    return "\n" not in value and value.strip().endswith(".lark")


def _existing_file(task: DictConfig, key: str) -> Path:
    value = task.get(key)
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise ConfigError(f"task.{key}={value}: no such file")
    return path.resolve()


def _data_file(task: DictConfig, key: str, roots: dict[str, str | None]) -> Path:
    """task.KEY's file: `<data>/PATH` under data.dir, `<cache>/PATH` under cache_dir (`ROOTS`),
    else the path as given; ConfigError naming the key when the directory or file is missing."""
    value = str(task.get(key))
    prefix = next((p for p in ROOTS if value.startswith(p)), None)
    if prefix is None:
        return _existing_file(task, key)
    setting, variable = ROOTS[prefix]
    root = roots.get(prefix)
    if root in (None, ""):
        raise ConfigError(
            f"task.{key}={value}: {setting} is not set (give {setting}=DIR or set "
            f"{variable}): {prefix} names a file under it"
        )
    path = Path(str(root)).expanduser() / value.removeprefix(prefix)
    if not path.is_file():
        raise ConfigError(f"task.{key}={value}: no such file {path} ({setting}={root})")
    return path.resolve()


def _text(task: DictConfig, key: str, default: str | None = None) -> str | None:
    value = task.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConfigError(f"task.{key}={value!r} is invalid: expected a string")
    return value


def build_spec(task: DictConfig, roots: dict[str, str | None]) -> CustomSpec:
    """Check a merged custom task config and compile its constraint (no tokenizer needed);
    `roots`: the directory of each `ROOTS` prefix."""
    name = _checked_name(task)
    files = _checked_files(task, roots)
    input_field, output_field = _checked_fields(task, files)
    if int(task.get("num_hints") or 0) != 0:
        raise ConfigError(
            f"task.num_hints={task.num_hints}: hints are not supported for custom "
            "tasks; set task.num_hints=0"
        )
    kind = _constraint_kind(task)
    schema, choices, grammar, describe = constraint_grammar(kind, _constraint_value(task, kind))
    check_lark(grammar, f"task.{kind}")
    metric = _checked_metric(task, kind)
    instruction = _text(task, "instruction")
    if not instruction:
        raise ConfigError(
            "task.instruction is required: the system instruction that says what "
            "to produce from the input"
        )
    reverse = _text(task, "reverse_instruction") or REVERSE_INSTRUCTION.format(
        instruction=instruction
    )
    return CustomSpec(
        name=name,
        files=files,
        input_field=input_field,
        output_field=output_field or None,
        kind=kind,
        grammar=grammar,
        schema=schema,
        choices=choices,
        metric=metric,
        instruction=instruction,
        output_format=_text(task, "output_format", describe),
        reverse_instruction=reverse,
    )


def _checked_name(task: DictConfig) -> str:
    """task.name: a valid name that no built-in task has."""
    name = str(task.name)
    builtins = builtin_task_names()
    if not NAME.fullmatch(name) or name in builtins:
        raise ConfigError(
            f"task.name={name!r} is invalid for a custom task: expected letters, "
            f"digits, _ . - and not a built-in task's name ({', '.join(builtins)})"
        )
    return name


def _checked_files(task: DictConfig, roots: dict[str, str | None]) -> dict[str, Path]:
    """The data files the task names (task.train required), each existing and of a known format."""
    if task.get("train") is None:
        raise ConfigError("task.train is required: the JSONL or CSV file of training inputs")
    files = {key: _data_file(task, key, roots) for key in FILE_KEYS if task.get(key) is not None}
    for key, path in files.items():
        if path.suffix.lower() not in FORMATS:
            raise ConfigError(
                f"task.{key}={task.get(key)}: expected a .jsonl, .ndjson, .csv or .tsv file"
            )
    return files


def _checked_fields(task: DictConfig, files: dict[str, Path]) -> tuple[str, str]:
    """(input field, output field or "")."""
    input_field = _text(task, "input_field", "input")
    output_field = _text(task, "output_field")
    if not input_field:
        raise ConfigError("task.input_field is empty: name the field holding the input text")
    if output_field == input_field:
        raise ConfigError(f"task.output_field={output_field!r} is also task.input_field")
    if "demonstrations" in files and not output_field:
        raise ConfigError(
            "task.demonstrations needs task.output_field (the field of their outputs)"
        )
    return input_field, output_field


def _constraint_kind(task: DictConfig) -> str:
    """The one output constraint the task sets (json_schema, regex, lark or choices)."""
    given = [key for key in CONSTRAINTS if task.get(key) not in (None, "")]
    if len(given) != 1:
        keys = ", ".join(f"task.{key}" for key in (given or CONSTRAINTS))
        raise ConfigError(
            f"{keys}: a custom task needs exactly one output constraint "
            f"({'none is set' if not given else 'several are set: keep one'})"
        )
    return given[0]


def _checked_metric(task: DictConfig, kind: str) -> str:
    """task.metric, `auto` resolved by the constraint's kind."""
    metric = str(task.get("metric") or "auto")
    metric = AUTO_METRIC.get(kind, "exact_match") if metric == "auto" else metric
    if metric not in METRICS:
        raise ConfigError(
            f"task.metric={metric!r} is invalid: expected auto or one of {', '.join(METRICS)}"
        )
    if metric == "json_fields_f1" and kind != "json_schema":
        raise ConfigError(
            f"task.metric=json_fields_f1 scores JSON fields: it needs "
            f"task.json_schema, not task.{kind}"
        )
    return metric


def _constraint_value(task: DictConfig, kind: str) -> Any:
    """The constraint's value as plain data, a Lark file's (`task.lark=FILE.lark`) read."""
    value = _plain(task.get(kind))
    if kind == "lark" and isinstance(value, str) and _is_lark_file(value):
        return read_text(_existing_file(task, kind))
    return value
