"""Where the data comes from: `data.dir` (default $GRAMMARRL_DATA_DIR), else the bundled samples.

Every reader returns `Row`s that remember their file and line, and reports bad rows to a
`SkipLog`, which counts them by reason and warns with the location: nothing is dropped silently.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grammarrl.errors import DataError

log = logging.getLogger(__name__)

SAMPLES_DIR = Path(__file__).resolve().parent / "samples"


@dataclass(frozen=True)
class Row:
    """One raw record of a corpus: its split, its fields, and where it was read (`file:line`)."""

    split: str
    fields: dict[str, Any]
    where: str


class SkipLog:
    """Counts skipped rows by reason; bad rows are warned one by one with their location."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.counts: Counter[str] = Counter()

    def skip(self, reason: str, where: str, detail: str = "") -> None:
        """A bad row (missing field, empty text, unknown label...): count it and warn."""
        self.counts[reason] += 1
        log.warning(
            "%s: %s: row skipped (%s)%s", self.task, where, reason, f": {detail}" if detail else ""
        )

    def drop(self, reason: str, count: int = 1) -> None:
        """Rows left out by the task's definition (e.g. CoNLL sentences without entities):
        counted, and reported in the task's loading summary rather than one by one."""
        if count:
            self.counts[reason] += count

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


def data_root(dir_value: str | Path | None) -> Path:
    """The data root: `data.dir` if set (it must exist), else the bundled samples."""
    if dir_value in (None, ""):
        _note_samples()
        return SAMPLES_DIR
    root = Path(str(dir_value)).expanduser()
    if not root.is_dir():
        raise DataError(
            f"data.dir={dir_value}: no such directory. Set data.dir (or GRAMMARRL_DATA_DIR) to "
            f"the folder holding one directory per task (the layout of {SAMPLES_DIR}), or unset it "
            "to use the bundled samples"
        )
    return root


@functools.cache
def _note_samples() -> None:
    """Say once per process that the bundled samples stand in for real data."""
    log.warning(
        "No data directory set (data.dir, or GRAMMARRL_DATA_DIR): using the bundled "
        "samples in %s, a few dozen examples per task for smoke tests; their numbers "
        "say nothing about the method",
        SAMPLES_DIR,
    )


def relative_uid(uid: str, root: str | Path | None) -> str:
    """An example id that is the same on every machine: a `file:line` id under `root` (the data
    directory, or a custom task's folder) made relative to it; other ids (hub rows, ids already
    relative, no root) unchanged. Also normalises the absolute ids of older results files."""
    path, sep, line = uid.rpartition(":")
    if not sep or not root or not os.path.isabs(path):
        return uid
    return f"{Path(os.path.relpath(path, str(root))).as_posix()}:{line}"


def task_dir(root: Path, name: str, task: str) -> Path:
    """The task's sub-directory `name` of the data root; a clear DataError if it is missing."""
    directory = root / name
    if not directory.is_dir():
        raise DataError(
            f"task {task}: expected the directory {directory} (see docs/builtin-tasks.md)"
        )
    return directory


def read_text(path: Path) -> str:
    """A UTF-8 file's text without a leading BOM; a DataError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"missing data file {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {path}: {err}") from None
    return text.removeprefix("\ufeff")


def read_lines(path: Path) -> list[str]:
    """The lines of a text file (split on '\\n' only: corpus text may hold other separators)."""
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def fingerprint(*parts: Any) -> str:
    """A short stable hash of the given values (cache keys)."""
    digest = hashlib.sha1()
    for part in parts:
        digest.update(repr(part).encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:12]
