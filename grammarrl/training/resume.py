"""Continuing a training run: the checkpoint it resumes from (checked against the run's
settings), and the metrics rows of the steps done before the restart."""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grammarrl.config.checks import resume_setting
from grammarrl.errors import ConfigError, ModelError
from grammarrl.runs.atomic import atomic_write
from grammarrl.runs.rundir import (
    BOOKKEEPING,
    CONTINUABLE,
    MODE_UNUSED,
    current_names,
    describe,
    differing_keys,
)
from grammarrl.training.callbacks import RUN_RECORD

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """A checkpoint this run continues from."""

    path: Path
    step: int  # optimizer steps it holds
    sigmas: tuple[float, float]  # the σ's it was trained with
    changes: str = ""  # settings changed since that a resume allows (`CONTINUABLE`), logged


def resolve_resume(out: Path, resume: Any, max_steps: int, config: dict[str, Any]) -> Resume | None:
    """The checkpoint to resume from: `resume` (`train.resume`) `auto` (default) takes
    `<run>/checkpoints/last.ckpt` when it exists (a restarted run with the same run dir), null
    starts afresh, a path must be a checkpoint: where the run starts, until it has written its
    own `last.ckpt`, which a restart then continues from (the same command resumes it). It must
    have been trained with this run's settings (`config`: the run's `config_dict`), except the
    `CONTINUABLE` ones (more steps, evaluation): a ConfigError names those that differ, or says
    `max_steps` (`trainer.max_steps`) is below its steps. A corrupt or truncated checkpoint is
    a ModelError."""
    setting = resume_setting(resume)
    if setting is None:
        return None
    own = out / "checkpoints" / "last.ckpt"
    path = own if setting == "auto" or own.is_file() else Path(setting)
    if setting != "auto" and path == own and own.resolve() != Path(setting).resolve():
        log.info(
            "train.resume=%s: this run has its own checkpoint %s; continuing from it", setting, own
        )
    if not path.is_file():
        return None
    ckpt = read_checkpoint(path)
    step, record = int(ckpt["global_step"]), ckpt.get(RUN_RECORD)
    if record is None:
        raise ConfigError(
            f"train.resume={resume}: {path} records no training settings "
            "(written by an older GrammarRL), so the resume cannot be checked; "
            "train.resume=null starts afresh"
        )
    old, new = current_names(record["config"]), config
    unused = (*BOOKKEEPING, *MODE_UNUSED["train"])  # e.g. the diagnose group, added since
    changed = differing_keys(old, new, ignore=(*unused, *CONTINUABLE))
    if changed:
        raise ConfigError(
            f"train.resume={resume}: {path} was trained with other settings: "
            f"{describe(old, new, changed)}; resume with the same settings, or "
            "start afresh (train.resume=null, in a new directory)"
        )
    if max_steps < step:
        raise ConfigError(
            f"trainer.max_steps={max_steps} is below the {step} steps "
            f"{path} already holds: resume with trainer.max_steps >= {step}"
        )
    changes = describe(old, new, differing_keys(old, new, ignore=unused))
    return Resume(path, step, tuple(record["sigmas"]), changes)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A training checkpoint (tensors memory-mapped); ModelError if it cannot be read as one."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # truncated zip, garbage, pickle errors: all mean "unreadable"
        raise ModelError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''}); delete it to start over, "
            "or pass train.resume=null or another checkpoint"
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "global_step" not in ckpt:
        raise ModelError(
            f"{path} is not a GrammarRL training checkpoint (no state_dict/global_step)"
        )
    return ckpt


METRICS_KEPT = "metrics.resumed.csv"


def _read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    keys = sorted({k for row in rows for k in row})

    def write(handle) -> None:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)

    atomic_write(path, write)


def stash_metrics(out: Path, resume: Resume) -> None:
    """Lightning's CSV logger deletes metrics.csv when it starts: on resume, keep the rows of
    the steps already done in metrics/metrics.resumed.csv (merged back by `merge_metrics`). A
    run started from another run's checkpoint (`train.resume=PATH`) starts with that run's rows,
    so its curves begin at step 0."""
    folder = out / "metrics"
    current, kept = folder / "metrics.csv", folder / METRICS_KEPT
    rows = _read_rows(kept) + _read_rows(current)
    source = resume.path.parent.parent / "metrics"  # <run>/checkpoints/last.ckpt -> <run>/metrics
    if not rows and source.resolve() != folder.resolve():
        rows = _read_rows(source / METRICS_KEPT) + _read_rows(source / "metrics.csv")
    rows = [
        r for r in rows if r.get("step") not in (None, "") and int(float(r["step"])) < resume.step
    ]
    if rows:
        folder.mkdir(parents=True, exist_ok=True)
        _write_rows(kept, rows)
    current.unlink(missing_ok=True)


def merge_metrics(out: Path) -> None:
    """After a resumed run: metrics.csv = rows kept from before the restart + the new rows."""
    folder = out / "metrics"
    kept = folder / METRICS_KEPT
    if kept.is_file():
        _write_rows(folder / "metrics.csv", _read_rows(kept) + _read_rows(folder / "metrics.csv"))
        kept.unlink()


def prepare_run_dir(out: Path, resume: Resume | None) -> None:
    """Before training: remove checkpoint writes a kill cut, and on resume keep the metrics of
    the steps already done (`stash_metrics`)."""
    for cut in (out / "checkpoints").glob(".*.tmp"):  # a checkpoint write cut by a kill
        cut.unlink(missing_ok=True)
    if resume is not None:
        log.info(
            "Resuming from %s (%d steps done)%s",
            resume.path,
            resume.step,
            f"; changed since: {resume.changes}" if resume.changes else "",
        )
        stash_metrics(out, resume)
