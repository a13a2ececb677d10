"""What one decode call returns, collected per prompt as its rows end: the greedy output, the
samples in their order, and the beam's result. The decoder's loop (`decoder.py`) and beam
search's step (`beam.py`) hand ended rows and closed beam groups here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from grammarrl.decoding.rows import GREEDY, Row
from grammarrl.decoding.types import BeamResult, Generation

log = logging.getLogger(__name__)

# An ended row's output: (row, finished, truncated, error) -> Generation (the decoder's).
GenerationOf = Callable[..., Generation]


@dataclass
class PromptOutputs:
    """One prompt's outputs: its greedy output, its samples by number, its beam's result."""

    samples: list[Generation | None]
    greedy: list[Generation] = field(default_factory=list)
    beam: BeamResult | None = None


class Outputs:
    """Every prompt's outputs of one decode call, filled as rows end and beam groups close."""

    def __init__(self, num_prompts: int, num_samples: int, generation: GenerationOf):
        self.prompts = [PromptOutputs([None] * num_samples) for _ in range(num_prompts)]
        self.generation = generation

    def emit(self, row: Row, finished: bool, truncated: bool, error: str | None = None) -> None:
        """A greedy or sample row has ended: its output takes its place."""
        if error:
            log.warning("constrained decoding stopped early: %s", error)
        gen = self.generation(row, finished, truncated, error)
        target = self.prompts[row.prompt]
        if row.kind == GREEDY:
            target.greedy.append(gen)
        else:
            target.samples[row.index] = gen

    def close_group(self, group, truncated: list[Row]) -> None:
        """A beam group (`beam.BeamGroup`) is done: its best finished hypothesis, else its best
        truncated row, else an empty output saying no beam survived (once per group)."""
        if group.result is not None:
            return
        if group.finished:
            top = group.finished[0]
        elif truncated:
            best = max(truncated, key=lambda r: r.score)
            top = self.generation(best, finished=False, truncated=True)
        else:
            top = Generation([], "", [], [], [], False, False, "beam", error="no beam survived")
        group.result = BeamResult(top=top, finished=list(group.finished))
        self.prompts[group.prompt].beam = group.result
