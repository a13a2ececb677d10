"""The reward as a component: what every part that scores candidates (calibration, training,
diagnosis, evaluation, the search potentials) takes, selected by `reward._target_`
(conf/reward/*.yaml; docs/rewards.md shows how to add one).

A reward gives each candidate y of an input x two terms, computed from the frozen reference's
passes (`grammarrl.rl.rewards.ReferenceScorer`) it declares in `passes`; training combines them
as r = (1-λ)·direct/σ_direct + λ·reverse/σ_reverse (`Mixing`), the σ's being measured on the
terms themselves (`grammarrl.rl.calibration`). The paper's reward (`BidirectionalReward`, the
default) takes R_direct and R_reverse as they are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from hydra.utils import get_class

from grammarrl.errors import ConfigError
from grammarrl.rl.rewards import PASSES, CandidateScores, ReferenceScorer
from grammarrl.rl.rloo import combine_rewards
from grammarrl.tasks.base import Task
from grammarrl.types import Example


@dataclass(frozen=True)
class Mixing:
    """How a reward's two terms make one: λ and the σ's (`lambda`, `reward.sigma_*`)."""

    lam: float
    sigma_direct: float
    sigma_reverse: float

    def combine(self, direct: torch.Tensor, reverse: torch.Tensor) -> torch.Tensor:
        """r = (1-λ)·direct/σ_direct + λ·reverse/σ_reverse of each candidate's terms."""
        return combine_rewards(direct, reverse, self.lam, self.sigma_direct, self.sigma_reverse)


class Reward(ABC):
    """A reward over the frozen reference's passes: `terms` maps what the passes measured of
    one input's candidates to the reward's direct and reverse terms."""

    passes: ClassVar[tuple[str, ...]] = PASSES  # the reference passes `terms` reads

    def __init__(self, scorer: ReferenceScorer):
        self.scorer = scorer

    @abstractmethod
    def terms(
        self, example: Example, texts: list[str], measured: CandidateScores
    ) -> CandidateScores:
        """The two terms of each candidate (`texts`, of input `example`) from `measured`."""

    def score(
        self,
        example: Example,
        prompt: list[int],
        candidates: list[list[int]],
        texts: list[str],
        also: Collection[str] = (),
    ) -> CandidateScores:
        """The terms of one input's candidates (token ids, end-of-turn included) after its
        forward `prompt`, running the reward's passes and those in `also` (training adds the
        direct pass for log pi_ref(y | x))."""
        passes = {*self.passes, *also}
        measured = self.scorer.score(example, prompt, candidates, texts, passes)
        return self.terms(example, texts, measured)

    def score_output(
        self, example: Example, prompt: list[int], token_ids: list[int], text: str
    ) -> tuple[float, float] | None:
        """(direct, reverse) terms of one output of `example` (e.g. what greedy decoding emitted,
        end-of-turn included); None for an empty output (nothing to score)."""
        if not token_ids:
            return None
        scores = self.score(example, prompt, [list(token_ids)], [text])
        return float(scores.direct[0]), float(scores.reverse[0])


class BidirectionalReward(Reward):
    """The paper's reward: R_direct and R_reverse as the reference measures them."""

    def terms(
        self, example: Example, texts: list[str], measured: CandidateScores
    ) -> CandidateScores:
        return measured


def reward_class(target: Any) -> type[Reward]:
    """The reward class `reward._target_` names; a one-line ConfigError when it names none."""
    try:
        cls = get_class(str(target))
    except (ImportError, ValueError) as err:  # a missing module or name; not a class
        reason = " ".join(str(err).split())  # Hydra's message spans lines
        raise ConfigError(f"reward._target_={target!r}: cannot import it ({reason})") from None
    if not issubclass(cls, Reward):
        raise ConfigError(f"reward._target_={target!r} is not a grammarrl.rl.reward.Reward")
    return cls


def make_reward(
    target: str, model: torch.nn.Module, tokenizer: Any, task: Task, share_prefix: bool = True
) -> Reward:
    """The reward `target` names, scored by `model` as the reference (its adapter disabled)."""
    return reward_class(target)(ReferenceScorer(model, tokenizer, task, share_prefix=share_prefix))
