"""Reward scoring of emitted outputs, one at a time (`eval.score_rewards`, the mechanism table's
rewards): the forward prompts' static part run once under the frozen reference, or per output."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.common import Bench, BenchResult, interleaved, real_prompts
from grammarrl.decoding.scoring import Prefix, common_prefix_length
from grammarrl.models.chat import end_of_turn_id
from grammarrl.rl.reward import BidirectionalReward
from grammarrl.rl.rewards import ReferenceScorer


class _NoStaticForward(ReferenceScorer):
    """The scorer before the forward prompts' static part was cached."""

    def forward_static_prefix(self, prompt: list[int]) -> Prefix | None:
        return None


def static_prefix(bench: Bench, task_name: str, count: int = 8) -> BenchResult:
    """(R_direct, R_reverse) of `count` test examples' gold outputs, scored one output at a
    time as evaluation does, with a fresh scorer per call (so the cached variant pays for
    running its static part once per 8 outputs; evaluation pays once per job)."""
    cfg = bench.config(f"task={task_name}")
    model, tokenizer = bench.load(cfg)
    task, prompts = real_prompts(cfg, tokenizer, count)
    examples = task.test_sets(1, count, cfg.seed)[0]
    end = end_of_turn_id(tokenizer)
    outputs = [tokenizer.encode(ex.target, add_special_tokens=False) + [end] for ex in examples]

    def run(scorer_class: type[ReferenceScorer]) -> list[tuple[float, float] | None]:
        reward = BidirectionalReward(scorer_class(model, tokenizer, task))
        return [
            reward.score_output(ex, prompt, ids, ex.target)
            for ex, prompt, ids in zip(examples, prompts, outputs)
        ]

    with torch.inference_mode():
        timing = interleaved(
            {"per_output": lambda: run(_NoStaticForward), "cached": lambda: run(ReferenceScorer)},
            bench.repeats,
        )
    per_output, cached = timing["per_output"].pop("result"), timing["cached"].pop("result")
    return BenchResult(
        name=f"reward_scoring_static_prefix/{task_name}",
        ratio=timing["per_output"]["median_s"] / timing["cached"]["median_s"],
        goal=2.0 if task_name == "wos" else 1.0,
        at_most=False,
        details={
            "task": task_name,
            "outputs": count,
            "prompt_tokens": [len(p) for p in prompts],
            "static_tokens": common_prefix_length(prompts),  # what the cached scorer keeps
            "output_tokens": [len(ids) for ids in outputs],
            "per_output_s": timing["per_output"],
            "cached_s": timing["cached"],
            "max_abs_reward_difference": _max_difference(per_output, cached),
        },
    )


def _max_difference(a: list[Any], b: list[Any]) -> float:
    return max(abs(x - y) for pa, pb in zip(a, b) if pa and pb for x, y in zip(pa, pb))
