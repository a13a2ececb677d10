"""The trained policy's side of a step: the models a step runs, the policy's mode (dropout),
log π_θ(y|x) with gradient, and the per-candidate sums of what the rollout recorded per token."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.scoring import sequence_logprobs
from grammarrl.rl.reward import Reward
from grammarrl.runs.paths import Roots, portable
from grammarrl.tasks.base import Task


@dataclass(frozen=True)
class StepModels:
    """What a training step runs: the policy (base model + LoRA), its grammar-constrained
    decoder, the reward (scored by the frozen reference: the policy with its adapter disabled),
    the tokenizer and the task (prompts, grammar)."""

    policy: torch.nn.Module
    decoder: ConstrainedDecoder
    reward: Reward
    tokenizer: Any
    task: Task


def policy_train_mode(policy: torch.nn.Module, dropout: bool) -> None:
    """Training mode (gradient checkpointing only acts in it) with every dropout layer off
    unless `dropout`: then log pi_theta is the deterministic policy that produced the rollouts."""
    policy.train()
    if not dropout:
        for module in policy.modules():
            if isinstance(module, torch.nn.Dropout):
                module.eval()


def policy_logp(
    policy: torch.nn.Module,
    prompts: list[list[int]],
    groups: list[list[Generation]],
    share_prefix: bool,
) -> torch.Tensor:
    """log pi_theta(y|x), unconstrained, summed over tokens, with gradient: [inputs, N+1]."""
    rows = []
    for prompt, group in zip(prompts, groups):
        token_logp = sequence_logprobs(
            policy,
            [prompt + g.token_ids for g in group],
            [len(prompt)] * len(group),
            share_prefix=share_prefix,
        )
        rows.append(torch.stack([lp.sum() for lp in token_logp]))
    return torch.stack(rows)


def summed_per_candidate(groups: list[list[Generation]], field: str) -> torch.Tensor:
    """A per-token `Generation` field summed over each candidate's output, [inputs, N+1], as
    the rollout policy computed it. `log_allowed_mass`: Σ_t log π_θ(V_t | x, y_<t), the log of
    its unconstrained mass on the tokens the grammar allowed (the logged `kl` on constrained
    samples is KL(q_θ‖q_ref) plus the change of this sum from π_ref's); `logp_constrained`:
    log q_θ(y|x), the grammar-constrained policy's log-probability of the output."""
    return torch.tensor([[sum(getattr(g, field)) for g in group] for group in groups])


def save_adapter(policy: Any, directory: Path) -> None:
    """PEFT's `save_pretrained`, with the base model's path in `adapter_config.json` named as
    run records name paths (`<cache>/models/...`), not as this machine's directory."""
    policy.save_pretrained(directory)
    config_file = Path(directory) / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = portable(
        config.get("base_model_name_or_path"), Roots.here()
    )
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
