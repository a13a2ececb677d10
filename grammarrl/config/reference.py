"""The docs' config reference, generated: every key of `grammarrl.config.schema` with its type, its
default in conf/ (per option of a config group where the options differ), its allowed values,
its role in a run's record and its description.

    python -m grammarrl.config.reference           # writes docs/reference/config.md
    python -m grammarrl.config.reference --check   # exits 1 when that page is stale
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from grammarrl.config import keys
from grammarrl.config.checks import CONF_DIR, group_options
from grammarrl.config.keys import Key, bounds, key_of
from grammarrl.config.schema import MOVED, SCALARS, SCHEMAS, TRAINER_SET

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md"
COMMAND = "python -m grammarrl.config.reference"
UNSET = object()  # a key that a group option leaves out


def undescribed(
    schemas: dict[str, type] | None = None, scalars: dict[str, Any] | None = None
) -> list[str]:
    """The keys declared without a description: schema fields not made with `keys.key`
    (or with an empty text), and top-level keys whose declaration is not a described `Key`
    (default: those of `grammarrl.config.schema`)."""
    schemas = SCHEMAS if schemas is None else schemas
    scalars = SCALARS if scalars is None else scalars
    missing = [
        f"{group}.{f.name}"
        for group, schema in schemas.items()
        for f in fields(schema)
        if key_of(f) is None or not key_of(f).description.strip()
    ]
    missing += [
        name
        for name, declared in scalars.items()
        if not isinstance(declared, Key) or not declared.description.strip()
    ]
    return missing


def _compose(overrides: list[str]) -> dict[str, Any]:
    """The composed config as plain data, interpolations left as written (so the page does not
    depend on this machine's environment), with Hydra's group choices under `_choices`."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    values = OmegaConf.to_container(cfg, resolve=False)
    values["_choices"] = dict(values.pop("hydra")["runtime"]["choices"])
    return values


def _render(value: Any) -> str:
    """A value as YAML writes it, in a code span; a non-empty mapping by its keys only."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: …" for k in value) + "}" if value else "{}"
    elif isinstance(value, list):
        text = "[" + ", ".join(str(v) for v in value) + "]"
    else:
        text = str(value)
    return f"`{text}`"


def _default_cell(values: dict[str, Any]) -> str:
    """One value when every option sets the same, else `options: value` for each value, naming
    the options that set it."""
    set_values = {option: value for option, value in values.items() if value is not UNSET}
    if len(set_values) == len(values) and len({repr(v) for v in set_values.values()}) == 1:
        return _render(next(iter(set_values.values())))
    by_value: dict[str, list[str]] = {}
    for option, value in set_values.items():
        by_value.setdefault(_render(value), []).append(option)
    return "<br>".join(f"{', '.join(options)}: {text}" for text, options in by_value.items())


def _escape(text: str) -> str:
    """Outside code spans, `<` and `>` as HTML entities (`<run dir>` is not a tag) and `|`
    escaped (not a cell border); code spans are left as written (the table keeps them whole)."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return "`".join(parts)


def _allowed(declared: Key) -> str:
    """The allowed values: the choices, the range (`>= 1`, `[0, 1)`) or the rule's words."""
    if declared.choices:
        return ", ".join(f"`{choice}`" for choice in declared.choices)
    if declared.rule:
        return _escape(declared.rule.expects)
    range_ = bounds(declared).removeprefix("in ")
    each = f", each `{range_}`" if range_ else ""
    return f"non-empty, distinct{each}" if declared.unique else f"`{range_}`" if range_ else ""


def _role(declared: Key) -> str:
    """The role, the modes it is compared for where not all (of those that keep a run record),
    and what older records ran with."""
    parts = [declared.role]
    recorded = [mode for mode in keys.MODES if mode not in keys.UNRECORDED]
    used = [mode for mode in recorded if mode in declared.modes]
    unused = [mode for mode in recorded if mode not in declared.modes]
    if unused:
        few = len(used) <= len(unused)
        parts.append(f"{', '.join(used)} only" if few else f"not {', '.join(unused)}")
    if declared.recorded_default is not keys.ALWAYS:
        parts.append(f"older records: {_render(declared.recorded_default)}")
    if declared.split_from:
        parts.append(f"older records: `{declared.split_from}`'s value")
    return "<br>".join(parts)


def _row(name: str, type_: str, default: str, declared: Key) -> str:
    type_ = "any" if type_ == "Any" else type_
    return (
        f"| `{name}` | `{type_}` | {default} | {_allowed(declared)} | {_role(declared)} "
        f"| {_escape(declared.description)} |"
    )


GENERATED = f"<!-- Generated by `{COMMAND}` from grammarrl/config/schema*.py and conf/: edit those, then run it. -->"
INTRO = (
    "Every key a run accepts. Set any of them on the command line "
    "(`python -m grammarrl.run eval.decoding=beam`), pick a config group's option "
    "(`task=wos`, `model=1b`), or print the composed config with "
    "`python -m grammarrl.run --cfg job`. Defaults are those of `conf/`; where a group's "
    "options set a key differently, each option's value is listed. `${...}` is an "
    "interpolation: the value of another key (`${task.lr}`) or of an environment "
    "variable (`${oc.env:NAME,fallback}`). An unknown key, a wrong type or a value "
    "outside its range stops the run before any model is loaded, naming the key."
)
ROLES = (
    "A key's role says what another value does to a run directory's outputs: **result**: "
    "changes results, so a re-run with another value is refused (`overwrite=true` replaces "
    "them); **continuable**: compared as a result, except that a restarted training run may "
    "change it and continue from its checkpoint (another change refuses the resume); "
    "**bookkeeping**: changes no "
    "number, never compared. A key is compared only for the modes listed where not all "
    "(`not diagnose`: mode=diagnose scores the frozen model alone). `older records`: what a "
    "run recorded before the key existed ran with."
)
HEADER = "| key | type | default | allowed | role | description |\n|---|---|---|---|---|---|"


def _group_section(group: str, configs: dict[str, dict[str, Any]], choice: str | None) -> str:
    """A group's table; `configs` maps each option to its composed config ('' for none)."""
    options = group_options(group)
    if len(options) > 1:
        listed = ", ".join(f"`{group}={option}`" for option in options)
        intro = f"Options: {listed} (default `{group}={choice}`)."
    else:
        intro = f"Set in `conf/{group}/{options[0]}.yaml`." if options else "Set in `config.yaml`."
    rows = []
    for f in fields(SCHEMAS[group]):
        values = {option: cfg[group].get(f.name, UNSET) for option, cfg in configs.items()}
        if len(values) == 1:
            values = {"": next(iter(values.values()))}
        default = _default_cell(values) if any(v is not UNSET for v in values.values()) else ""
        rows.append(_row(f"{group}.{f.name}", str(f.type), default, key_of(f)))
    return "\n".join([f"## {group}", "", intro, "", HEADER, *rows])


def generate() -> str:
    """The reference page, from the schema and conf/ alone."""
    missing = undescribed()
    if missing:
        raise ValueError(
            f"config keys without a description: {', '.join(missing)} "
            "(declare each with grammarrl.config.keys.key)"
        )
    base = _compose([])
    choices = base["_choices"]
    sections = []
    rows = [_row(name, k.type or "", _render(base[name]), k) for name, k in SCALARS.items()]
    sections.append("\n".join(["## Top-level keys", "", HEADER, *rows]))
    for group in SCHEMAS:
        options = group_options(group)
        if len(options) > 1:
            configs = {option: _compose([f"{group}={option}"]) for option in options}
        else:
            configs = {"": base}
        sections.append(_group_section(group, configs, choices.get(group)))
    trainer_set = "\n".join(f"- `trainer.{name}`: use {use}" for name, use in TRAINER_SET.items())
    moved = "\n".join(f"| `{old}` | `{new}` |" for old, new in MOVED.items())
    return (
        "\n\n".join(
            [
                "---\nhide: [navigation]\n---\n\n# Config reference",
                GENERATED,
                INTRO,
                ROLES,
                *sections,
                "## Other Trainer arguments\n\n"
                "Any other argument of `lightning.pytorch.Trainer` can be added with `+`, e.g. "
                "`+trainer.precision=bf16-mixed`, except those GrammarRL sets itself:\n\n"
                + trainer_set,
                "## Keys that moved\n\n"
                "An override of an old name is refused with its new one; configs recorded under "
                "the old name are read under the new one.\n\n"
                "| old key | key now |\n|---|---|\n" + moved,
            ]
        ).rstrip()
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page = generate()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE.name} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
