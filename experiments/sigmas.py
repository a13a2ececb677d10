"""The σ's a training run trained with: from its config, its last checkpoint or its entry of the
calibration file, so that rewards of any system's outputs combine as in training."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.runs import Evaluation
from grammarrl.errors import GrammarRLError
from grammarrl.rl.calibration import calibration_conditions, calibration_key, differences, entries
from grammarrl.runs.rundir import current_names


@dataclass(frozen=True)
class Sigmas:
    direct: float
    reverse: float
    source: str


def training_sigmas(ev: Evaluation) -> Sigmas | None:
    """The σ's a training run trained with: set in its config, else recorded in its last
    checkpoint, else its entry of the calibration file (`reward.calibration_file`) measured
    under its conditions; None when none is found."""
    direct, reverse = ev.get("reward.sigma_direct"), ev.get("reward.sigma_reverse")
    if direct is not None and reverse is not None:
        return Sigmas(float(direct), float(reverse), "set in the run's config")
    checkpoint = ev.run.path / "checkpoints" / "last.ckpt"
    if checkpoint.is_file():
        from grammarrl.training.callbacks import RUN_RECORD  # lightning: only when needed
        from grammarrl.training.resume import read_checkpoint

        try:
            record = read_checkpoint(checkpoint).get(RUN_RECORD) or {}
        except GrammarRLError:
            record = {}
        if record.get("sigmas"):
            return Sigmas(*map(float, record["sigmas"]), f"recorded in {checkpoint}")
    return calibrated_sigmas(ev)


def calibrated_sigmas(ev: Evaluation) -> Sigmas | None:
    """The run's calibration-file entry: its task/model/nN_bB key, measured under the run's
    conditions (the dtype as its results record it; a config recorded before a key was added or
    moved reads under today's names)."""
    path = locate(ev.get("reward.calibration_file"), ev.run.path)
    config = ev.results.get("config") or {}
    if path is None or not config:
        return None
    cfg = OmegaConf.create(current_names(config))
    try:
        cfg.device = "cpu"  # the dtype comes from the results, not from this machine
        cfg.model.dtype = str(ev.results.get("dtype") or "float32")
        conditions = calibration_conditions(cfg)
        key = calibration_key(
            cfg.task.name, cfg.model.name, cfg.rollout.num_samples, cfg.rollout.beam_width
        )
    except (OmegaConfBaseException, GrammarRLError):
        return None
    if not ev.results.get("dtype"):
        conditions.pop("dtype")
    found = [
        e for e in entries(json.loads(path.read_text()), key) if not differences(e, conditions)
    ]
    if not found:
        return None
    return Sigmas(
        float(found[-1]["sigma_direct"]),
        float(found[-1]["sigma_reverse"]),
        f"{os.path.relpath(path)} [{key}]",
    )


def locate(name: str | None, run_path: Path) -> Path | None:
    """A file named in a run's config: absolute, or relative to the directory the sweep was
    launched from (the current one, or one holding the run); else a file of that name archived
    beside the run's sweep (in a directory holding the run: committed results)."""
    if not name:
        return None
    path = Path(name)
    ancestors = run_path.resolve().parents
    bases = [Path()] if path.is_absolute() else [Path.cwd(), *ancestors]
    candidates = [base / path for base in bases] + [base / path.name for base in ancestors]
    return next((c for c in candidates if c.is_file()), None)
