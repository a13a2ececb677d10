"""A search draw's progress on disk: a killed search resumes where it stopped and draws exactly
the particles an uninterrupted run would.

Search visits the distinct examples in a fixed order, drawing from two seeded generators, so the
examples still to come depend only on those generators' states. `<run>/search_progress/
draw<d>_seed<s>.pt` keeps them, the finished examples' particles and the draw's cost so far
(forward token positions of the proposal and of the potential, seconds); it is written
atomically at most every `SAVE_EVERY_SECONDS` and when the draw ends, and deleted once the
results are written. The run directory's record already refuses a re-run under other settings
(`grammarrl.runs.rundir`); the file itself also names its examples and sampler seed, and is
refused when they differ.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grammarrl.decoding.smc import ParticleSet
from grammarrl.errors import GrammarRLError

log = logging.getLogger(__name__)

FOLDER = "search_progress"
SAVE_EVERY_SECONDS = 60.0


@dataclass
class Progress:
    """Where a draw stands: the particles of its first examples (in search order), the
    generators' states after them and what the draw has cost so far."""

    populations: dict[str, ParticleSet]
    generator: torch.Tensor
    resample_generator: torch.Tensor
    seconds: float
    potential_seconds: float
    search_tokens: int
    potential_tokens: int


class DrawProgress:
    """The progress file of draw `draw` (sampler seed `seed`) of the search run in `out`, over
    the examples `uids` in search order."""

    def __init__(self, out: str | Path, draw: int, seed: int, uids: list[str]):
        self.path = Path(out) / FOLDER / f"draw{draw}_seed{seed}.pt"
        self.key = {"sampler_seed": seed, "uids": list(uids)}
        self.earlier_seconds = 0.0  # the loaded progress's seconds: what the draw took before
        self._saved_at = time.monotonic()

    def load(self) -> Progress | None:
        """The saved progress, or None when there is none; an error when it was written for
        other examples or another sampler seed."""
        if not self.path.is_file():
            return None
        stored = torch.load(self.path, map_location="cpu", weights_only=False)
        differ = [k for k in self.key if stored["key"].get(k) != self.key[k]]
        if differ:
            raise GrammarRLError(
                f"{self.path}: saved by a search of other {' and '.join(differ)}; delete it "
                "to draw this one from the start"
            )
        progress: Progress = stored["progress"]
        self.earlier_seconds = progress.seconds
        log.info(
            "search: resuming from %s (%d of %d examples done)",
            self.path,
            len(progress.populations),
            len(self.key["uids"]),
        )
        return progress

    def save(self, progress: Progress, force: bool = False) -> None:
        """Write `progress` (atomically) if `SAVE_EVERY_SECONDS` have passed since the last
        write, or when `force`."""
        if not force and time.monotonic() - self._saved_at < SAVE_EVERY_SECONDS:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        torch.save({"key": self.key, "progress": progress}, partial)
        os.replace(partial, self.path)
        self._saved_at = time.monotonic()


def remove_progress(out: str | Path) -> None:
    """Delete a finished search's progress files."""
    folder = Path(out) / FOLDER
    for path in folder.glob("*.pt"):
        path.unlink()
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
