"""Beam-search bookkeeping: a prompt's group of finished hypotheses, ranked best first."""

from __future__ import annotations

from grammarrl.decoding.types import BeamResult, Generation


class BeamGroup:
    __slots__ = ("finished", "length_penalty", "prompt", "result", "width")

    def __init__(self, prompt: int, width: int, length_penalty: float):
        self.prompt = prompt
        self.width = width
        self.length_penalty = length_penalty
        self.finished: list[Generation] = []  # kept sorted by beam_score, best first
        self.result: BeamResult | None = None

    def score(self, sum_logp: float, length: int) -> float:
        """A hypothesis' rank: summed constrained log-prob / length**length_penalty."""
        return sum_logp / length**self.length_penalty if self.length_penalty else sum_logp


def rank(group: BeamGroup, gen: Generation) -> float:
    return group.score(gen.sum_logp_constrained, len(gen.token_ids))


def insort(group: BeamGroup, gen: Generation) -> None:
    """Insert into the group's finished list keeping best-first order (stable: earlier
    hypotheses win ties)."""
    finished, score = group.finished, rank(group, gen)
    pos = len(finished)
    while pos > 0 and rank(group, finished[pos - 1]) < score:
        pos -= 1
    finished.insert(pos, gen)
