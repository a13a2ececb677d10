"""One rollout batch: constrained candidates per input, scored with the reward by the frozen reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.models.chat import encode_prompt
from grammarrl.rl.reward import Reward
from grammarrl.rl.rewards import DIRECT
from grammarrl.rl.settings import RolloutSettings
from grammarrl.runs.timing import clock
from grammarrl.tasks.base import Task
from grammarrl.types import Example


@dataclass
class RolloutBatch:
    """Per input: the prompt, the N sampled + 1 beam candidates, their reward's two terms and
    log pi_ref(y | x)."""

    examples: list[Example]
    prompts: list[list[int]]
    groups: list[list[Generation]]
    direct: torch.Tensor  # [inputs, N+1], the reward's direct term; 0 where not `valid`
    reverse: torch.Tensor  # [inputs, N+1], its reverse term; 0 where not `valid`
    ref_logp: torch.Tensor  # [inputs, N+1]; 0 where not `valid`
    valid: torch.Tensor  # [inputs, N+1] bool: False for an empty candidate, dropped from its group
    seconds: dict[str, float]  # wall time per phase: "rollout", "scoring"


def collect_rollouts(
    decoder: ConstrainedDecoder,
    reward: Reward,
    tokenizer: Any,
    task: Task,
    examples: list[Example],
    rollout: RolloutSettings,
    generator: torch.Generator | None = None,
) -> RolloutBatch:
    """Generate the group of N samples + beam top-1 for each input and score it with the reward
    (and log pi_ref(y | x), from the direct pass).

    An empty candidate (a dead end at the first token, or no beam survived) has no tokens to
    score: it is marked invalid and takes no part in rewards, advantages or the loss."""
    started = clock()
    prompts = [encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples]
    groups = decoder.rollout(
        prompts,
        num_samples=rollout.num_samples,
        beam_width=rollout.beam_width,
        temperature=rollout.temperature,
        generator=generator,
        length_penalty=rollout.length_penalty,
    )
    rolled_out = clock()
    scores = [
        reward.score(ex, prompt, [g.token_ids for g in group], [g.text for g in group], (DIRECT,))
        for ex, prompt, group in zip(examples, prompts, groups)
    ]
    valid = torch.tensor([[len(g.token_ids) > 0 for g in group] for group in groups])

    def gather(values: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(values)
        return stacked.masked_fill(~valid.to(stacked.device), 0.0)

    return RolloutBatch(
        examples=examples,
        prompts=prompts,
        groups=groups,
        direct=gather([s.direct for s in scores]),
        reverse=gather([s.reverse for s in scores]),
        ref_logp=gather([s.ref_logp for s in scores]),
        valid=valid,
        seconds={"rollout": rolled_out - started, "scoring": clock() - rolled_out},
    )
