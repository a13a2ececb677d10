"""A second reward, the example of docs/rewards.md: the paper's reward with its direct term
divided by the output's length in tokens, so that a short output no longer wins by length alone
(`reward=length_normalised`)."""

from __future__ import annotations

from dataclasses import replace

from grammarrl.rl.reward import Reward
from grammarrl.rl.rewards import CandidateScores
from grammarrl.types import Example


class LengthNormalisedReward(Reward):
    """direct = R_direct / |y| (|y|: the tokens of y, end-of-turn included); reverse = R_reverse."""

    def terms(
        self, example: Example, texts: list[str], measured: CandidateScores
    ) -> CandidateScores:
        lengths = measured.lengths.to(measured.direct.device, measured.direct.dtype)
        return replace(measured, direct=measured.direct / lengths)
