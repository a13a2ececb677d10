"""Atomic file writes: a temp file beside the target, fsynced, renamed over it, so a kill or a
full disk mid-write leaves the previous file intact (results, checkpoints, run records)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig, OmegaConf

from grammarrl.errors import GrammarRLError


class AtomicWriteError(GrammarRLError):
    """A results, checkpoint or record file could not be written (e.g. disk full); the
    previous file is intact."""


def atomic_write(
    path: str | Path, write: Callable[[IO[Any]], object], binary: bool = False
) -> Path:
    """Write `path` through `write(handle)` into a temp file beside it, fsync, rename over it:
    a kill or a full disk mid-write leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):  # disk full, quota, permissions: one clear message
            kept = f"the previous {path.name} is unchanged" if path.exists() else "nothing written"
            raise AtomicWriteError(f"cannot write {path}: {err.strerror or err}; {kept}") from err
        raise
    return path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_json(path: str | Path, obj: Any) -> Path:
    """Write JSON atomically (temp file in the same directory + os.replace)."""
    return atomic_write(
        Path(path), lambda h: h.write(json.dumps(_jsonable(obj), indent=2, ensure_ascii=False))
    )


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write JSON lines atomically."""

    def write(handle):
        for row in rows:
            handle.write(json.dumps(_jsonable(row), ensure_ascii=False) + "\n")

    return atomic_write(Path(path), write)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, DictConfig) or OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj
