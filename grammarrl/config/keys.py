"""What the schema declares about each config key: a `Key`, made once per key with `key(...)`.

A key's declaration holds its description, its allowed values (a fixed set, a numeric range or a
named rule) and its role in a run's record: whether another value changes results (`RESULT`: a
re-run with another value is refused), is a training setting a resumed run may change
(`CONTINUABLE`), or changes no number at all (`BOOKKEEPING`: never compared); the modes whose
numbers it changes; and what a run recorded before the key existed ran with. Validation
(`check_value`), the run-record comparison and resume refusal (`grammarrl.config.roles`) and the
docs' config reference (`grammarrl.config.reference`) all read it from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any

from grammarrl.errors import ConfigError

MODES = ("train", "eval", "calibrate", "search", "diagnose", "prepare", "export")
# mode=diagnose decodes and scores with the frozen model only: training's, evaluation's and
# search's keys do not reach it.
NOT_DIAGNOSE = tuple(mode for mode in MODES if mode != "diagnose")
# The modes that read a group of keys, as tests/test_mode_keys.py measures them; prepare and
# export write no run record, so listing them changes no comparison.
UNRECORDED = ("prepare", "export")
TRAINING = ("train", *UNRECORDED)  # training's own settings: LoRA, optimiser, Trainer, train.*
ROLLOUTS = ("train", "calibrate", "diagnose", *UNRECORDED)  # rollouts and the reward's σ's
TEST_SETS = ("train", "eval", "search", *UNRECORDED)  # the test sets and their decoding
SEARCHING = ("search", *UNRECORDED)  # a search's own settings
PARTICLES = ("train", "search", *UNRECORDED)  # drawing particles: search, amortised-IS training

RESULT = "result"  # another value changes results: a re-run with it is refused
CONTINUABLE = "continuable"  # a result, but a training run may change it and still resume
BOOKKEEPING = "bookkeeping"  # changes no number a job writes: never compared
ROLES = (RESULT, CONTINUABLE, BOOKKEEPING)


class _Always:
    """The `recorded_default` of a key that records have held from the start."""

    def __repr__(self) -> str:
        return "ALWAYS"


ALWAYS = _Always()


@dataclass(frozen=True)
class Rule:
    """A check no range expresses: `test(value)` is true for an allowed value, which `expects`
    describes (`auto, cpu, cuda or cuda:N`)."""

    test: Callable[[Any], bool]
    expects: str


@dataclass(frozen=True)
class Key:
    """What the schema declares about one config key besides its value.

    - `description`: one line for the docs' reference.
    - allowed values: `choices` (a fixed set), or the bounds `at_least`, `above`, `at_most`,
      `below` (a number or an integer, as the type says), or a `rule`; `unique` (list keys):
      non-empty without repeats, the bounds then holding for each item. A key whose type
      admits None (`int | None`) may also be null.
    - `type`: top-level keys only (a group's keys take their dataclass annotation).
    - `role`: `RESULT`, `CONTINUABLE` or `BOOKKEEPING` (module docstring); `modes`: the modes
      whose numbers it changes (compared only for those).
    - `recorded_default`: the value a run recorded before the key existed ran with;
      `split_from`: the key whose value it ran with instead (the key was split off that one).
    """

    description: str
    choices: tuple[str, ...] | None = None
    type: str | None = None
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    unique: bool = False
    rule: Rule | None = None
    role: str = RESULT
    modes: tuple[str, ...] = MODES
    recorded_default: Any = ALWAYS
    split_from: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r}: expected one of {', '.join(ROLES)}")
        if not set(self.modes) <= set(MODES):
            raise ValueError(f"modes={self.modes!r}: expected modes among {', '.join(MODES)}")


def key(
    description: str,
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    **declared: Any,
) -> Any:
    """A schema field carrying its `Key` (read back with `key_of`); `declared` takes the
    `Key`'s other fields. `default` or `default_factory` only where some configs of the group
    leave the key out."""
    metadata = {"grammarrl": Key(description, **declared)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def key_of(schema_field: Any) -> Key | None:
    """The `Key` a dataclass field was declared with, or None (an undescribed field)."""
    return schema_field.metadata.get("grammarrl")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def bounds(declared: Key) -> str:
    """The range in words: `>= 1`, `> 0`, `in [0, 1)`; '' when unbounded."""
    low = [(op, v) for op, v in ((">=", declared.at_least), (">", declared.above)) if v is not None]
    high = [(op, v) for op, v in (("<=", declared.at_most), ("<", declared.below)) if v is not None]
    if low and high:
        (low_op, low_value), (high_op, high_value) = low[0], high[0]
        opening, closing = "[" if low_op == ">=" else "(", "]" if high_op == "<=" else ")"
        return f"in {opening}{_number(low_value)}, {_number(high_value)}{closing}"
    return " ".join(f"{op} {_number(v)}" for op, v in (low or high)[:1])


def _in_bounds(declared: Key, value: float) -> bool:
    return (
        (declared.at_least is None or value >= declared.at_least)
        and (declared.above is None or value > declared.above)
        and (declared.at_most is None or value <= declared.at_most)
        and (declared.below is None or value < declared.below)
    )


def constrained(declared: Key) -> bool:
    """Whether the key declares allowed values beyond its type."""
    return bool(declared.choices or declared.rule or declared.unique or bounds(declared))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


# The types validation tests (a group's types are OmegaConf's to enforce first): a value of the
# type in words, several of them, and the test. A range on another type bounds a number.
TYPES: dict[str, tuple[str, str, Callable[[Any], bool]]] = {
    "int": ("an integer", "integers", is_int),
    "float": ("a number", "numbers", _is_number),
    "bool": ("true or false", "true or false", _is_bool),
}


def _parse(annotation: str) -> tuple[str, bool]:
    """`int | None` -> ("int", nullable); `list[float]` -> ("float", False)."""
    parts = [part.strip() for part in annotation.split("|")]
    base = next((part for part in parts if part != "None"), "Any")
    return base.removeprefix("list[").removesuffix("]"), "None" in parts


def expected(declared: Key, annotation: str) -> str | None:
    """What a value of the key must be, in words (`an integer >= 1`, `one of a, b or null`),
    or None where neither its declaration nor its type (top-level keys) asks anything."""
    base, nullable = _parse(annotation)
    one, many, _ = TYPES.get(base, TYPES["float"])
    range_ = bounds(declared)
    if declared.choices:
        text = f"one of {', '.join(declared.choices)}"
    elif declared.rule:
        text = declared.rule.expects
    elif declared.unique:
        text = " ".join(filter(None, [f"a non-empty list of distinct {many}", range_]))
    elif range_ or base in TYPES:
        text = " ".join(filter(None, [one, range_]))
    else:
        return None
    return f"{text} or null" if nullable else text


def _allowed(value: Any, declared: Key, base: str) -> bool:
    """Whether the value is one `expected` describes (null aside)."""
    if declared.choices:
        return value in declared.choices
    if declared.rule:
        return declared.rule.test(value)
    items = [value]
    if declared.unique:
        if isinstance(value, str) or not isinstance(value, Sequence):
            return False
        items = list(value)
        if not items or len(set(items)) != len(items):
            return False
    if base in TYPES or bounds(declared):
        is_type = TYPES.get(base, TYPES["float"])[2]
        return all(is_type(item) and _in_bounds(declared, item) for item in items)
    return True


def check_value(name: str, value: Any, declared: Key, annotation: str) -> None:
    """Refuse a value outside what the key declares (its type, for top-level keys, which no
    dataclass types), with a ConfigError naming the key: `lambda=1.5 is invalid: expected a
    number in [0, 1]`."""
    text = expected(declared, annotation)
    base, nullable = _parse(annotation)
    if text is None or (value is None and nullable) or _allowed(value, declared, base):
        return
    shown = list(value) if declared.unique and isinstance(value, Sequence) else value
    raise ConfigError(f"{name}={shown!r} is invalid: expected {text}")
