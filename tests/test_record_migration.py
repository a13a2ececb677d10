"""The run-record migration tables (`rundir.current_names`: `MOVED`, `TRAINER_BEFORE`, each key's
`recorded_default` and `split_from`) hold exactly what the committed run records need.

A record needs an entry when the entry changes the record (an old name it still holds, a key it
lacks) and the record's mode compares that key: the modes a key is compared for are what
tests/test_mode_keys.py measures each mode reading. An entry no committed record needs is dead
weight and fails here, named; tests/test_reliability.py checks the other direction (a key the
oldest records lack and their mode compares declares what they ran with).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from grammarrl.config.schema import MOVED
from grammarrl.runs import rundir

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results"


def _records() -> list[tuple[str, dict[str, Any]]]:
    """(mode, config) of every committed run record."""
    records = [json.loads(path.read_text()) for path in sorted(RESULTS.rglob(rundir.RECORD))]
    return [(record["mode"], record["config"]) for record in records]


RECORDS = _records()


def _holds(config: Mapping[str, Any], key: str) -> bool:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _compared(key: str, mode: str) -> bool:
    return not rundir._under(key, (*rundir.BOOKKEEPING, *rundir.MODE_UNUSED[mode]))


def _old_trainer(config: Mapping[str, Any]) -> bool:
    return isinstance(config.get("trainer"), Mapping) and "_target_" not in config["trainer"]


ENTRIES = {
    **{f"MOVED {old}": (lambda c, old=old: _holds(c, old), new) for old, new in MOVED.items()},
    **{
        f"TRAINER_BEFORE {name}": (_old_trainer, f"trainer.{name}")
        for name in rundir.TRAINER_BEFORE
    },
    **{
        f"recorded_default of {key}": (lambda c, key=key: not _holds(c, key), key)
        for key in rundir.ADDED
    },
    **{
        f"split_from of {key}": (lambda c, key=key: not _holds(c, key), key)
        for key in rundir.SPLIT_FROM
    },
}


def test_the_committed_records_are_read():
    assert len(RECORDS) >= 50 and {"train", "eval", "search"} <= {m for m, _ in RECORDS}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_every_migration_entry_is_needed_by_a_committed_record(entry):
    applies, key = ENTRIES[entry]
    needing = [mode for mode, config in RECORDS if applies(config) and _compared(key, mode)]
    assert needing, f"{entry}: no committed run record needs it (none whose mode compares {key})"


def test_the_entries_this_check_removed_are_still_unneeded():
    """Dropped because no committed record needs them: `diagnose.bootstrap_draws`'s
    recorded_default (no record of a mode that compares it lacks it) and `MOVED`'s
    `trainer.callbacks` (no record holds it; an override of it is refused as a Trainer argument
    GrammarRL sets)."""
    key = "diagnose.bootstrap_draws"
    assert not [m for m, c in RECORDS if not _holds(c, key) and _compared(key, m)]
    assert not [c for _, c in RECORDS if _holds(c, "trainer.callbacks")]
    assert key not in rundir.ADDED and "trainer.callbacks" not in MOVED
