"""Which keys a run record compares, derived from each key's declared role
(`grammarrl.config.keys.Key`): the sets `grammarrl.runs.rundir` and a training resume use.

Each set is a tuple of dotted keys, read as prefixes: a group is named whole where every key of
its schema shares the property, so that keys the schema does not list (a Trainer argument added
with `+trainer.<name>`, a key an older record holds) share it too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from grammarrl.config import keys
from grammarrl.config.keys import Key, key_of
from grammarrl.config.schema import SCALARS, SCHEMAS

UNDECLARED = Key("")  # a field made without `key` (the reference refuses it): a result key


def declared() -> dict[str, Key]:
    """Every declared key by its dotted name: the top-level keys, then each group's."""
    group_keys = {
        f"{group}.{f.name}": key_of(f) or UNDECLARED
        for group, schema in SCHEMAS.items()
        for f in fields(schema)
    }
    return {**SCALARS, **group_keys}


def keys_where(has: Callable[[Key], bool]) -> tuple[str, ...]:
    """The keys with a property, a group named whole where all its keys have it."""
    found = [name for name, declaration in SCALARS.items() if has(declaration)]
    for group, schema in SCHEMAS.items():
        names = [f.name for f in fields(schema) if has(key_of(f) or UNDECLARED)]
        whole = len(names) == len(fields(schema))
        found += [group] if whole else [f"{group}.{name}" for name in names]
    return tuple(found)


def bookkeeping() -> tuple[str, ...]:
    """Keys that change no number a job writes: never compared."""
    return keys_where(lambda k: k.role == keys.BOOKKEEPING)


def continuable() -> tuple[str, ...]:
    """Keys a training run may change and still continue from its checkpoint."""
    return keys_where(lambda k: k.role == keys.CONTINUABLE)


def unused_by(mode: str) -> tuple[str, ...]:
    """Keys that change no number of the mode's jobs: not compared for it."""
    return keys_where(lambda k: mode not in k.modes)


def recorded_defaults() -> dict[str, Any]:
    """Keys added since records began: the value a record written before a key ran with."""
    return {
        name: k.recorded_default
        for name, k in declared().items()
        if k.recorded_default is not keys.ALWAYS
    }


def split_from() -> dict[str, str]:
    """Keys split off another since (new -> old): a record written before ran with the old
    key's value."""
    return {name: k.split_from for name, k in declared().items() if k.split_from is not None}
