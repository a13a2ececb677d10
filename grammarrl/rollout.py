"""One rollout batch: constrained candidates per input, scored by the frozen reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import time

import torch
from omegaconf import DictConfig

from grammarrl.chat import encode_prompt
from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.rewards import ReferenceScorer
from grammarrl.tasks.base import Example, Task


@dataclass
class RolloutBatch:
    """Per input: the prompt, the N sampled + 1 beam candidates and their reference scores."""

    examples: list[Example]
    prompts: list[list[int]]
    groups: list[list[Generation]]
    direct: torch.Tensor  # [inputs, N+1]
    reverse: torch.Tensor  # [inputs, N+1]
    ref_logp: torch.Tensor  # [inputs, N+1]
    seconds: dict[str, float]  # wall time per phase: "rollout", "scoring"


def collect_rollouts(decoder: ConstrainedDecoder, scorer: ReferenceScorer, tokenizer: Any,
                     task: Task, examples: list[Example], rollout: DictConfig,
                     generator: torch.Generator | None = None) -> RolloutBatch:
    """Generate the group of N samples + beam top-1 for each input and score it with pi_ref."""
    started = time.perf_counter()
    prompts = [encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples]
    groups = decoder.rollout(prompts, num_samples=rollout.num_samples,
                             beam_width=rollout.beam_width, temperature=rollout.temperature,
                             generator=generator)
    rolled_out = time.perf_counter()
    scores = [
        scorer.score(ex, prompt, [g.token_ids for g in group], [g.text for g in group])
        for ex, prompt, group in zip(examples, prompts, groups)
    ]
    return RolloutBatch(
        examples=examples, prompts=prompts, groups=groups,
        direct=torch.stack([s.direct for s in scores]),
        reverse=torch.stack([s.reverse for s in scores]),
        ref_logp=torch.stack([s.ref_logp for s in scores]),
        seconds={"rollout": rolled_out - started, "scoring": time.perf_counter() - rolled_out},
    )
