"""What an RLOO step logs: its loss and KL, the rewards and advantages of its valid candidates,
validity, the share of groups that gave no signal, and the first input's candidates as a
sample; and the warning when a stretch of steps gave RLOO no signal at all."""

from __future__ import annotations

from typing import Any

import torch

from grammarrl.training.policy import summed_per_candidate
from grammarrl.training.rloo_step import StepOutputs


def identical_groups(groups: list[list[Any]], valid: torch.Tensor) -> torch.Tensor:
    """Per group: True when all its valid candidates are the same output (or fewer than two are
    valid). Such a group gives RLOO nothing to compare: every advantage is 0."""
    flags = []
    for group, ok in zip(groups, valid.tolist()):
        outputs = {tuple(g.token_ids) for g, keep in zip(group, ok) if keep}
        flags.append(len(outputs) <= 1)
    return torch.tensor(flags)


class SignalWatch:
    """Collects the steps at which every rollout group was identical (no learning signal) and
    reports each stretch of them once, with its step range, when it ends."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.last: int | None = None

    def update(self, step: int, silent: bool) -> str | None:
        """Record one step; returns a warning when a silent stretch has just ended."""
        if silent:
            self.start = step if self.start is None else self.start
            self.last = step
            return None
        return self.flush()

    def flush(self) -> str | None:
        """The warning for a stretch still open (at the end of training), else None."""
        if self.start is None:
            return None
        message = (
            f"steps {self.start}-{self.last}: every rollout group's candidates were "
            "identical, so RLOO had no signal (all advantages 0) and the policy moved only "
            "through the KL term; the rollouts have collapsed (see train/identical_groups)"
        )
        self.start = self.last = None
        return message


def rloo_metrics(step: StepOutputs, identical: torch.Tensor) -> dict[str, torch.Tensor]:
    """The step's `train/*` metrics; `identical`: its `identical_groups`. Rewards, advantages
    and grammar sums are means over the valid candidates."""
    out, rewards = step.rollouts, step.rewards
    gens = [g for group in out.groups for g in group]
    device = rewards.device  # rewards, scores and advantages share a device
    valid = out.valid.to(device)
    best = rewards.masked_fill(~valid, float("-inf")).argmax(dim=-1)

    def valid_mean(values: torch.Tensor) -> torch.Tensor:
        return values[valid].mean()

    def sums(field: str) -> torch.Tensor:
        return summed_per_candidate(out.groups, field).to(device)

    return {
        "train/loss": step.loss.detach(),
        "train/loss_pg": step.parts["loss/pg"],
        "train/kl": step.parts["kl"],
        "train/reward": valid_mean(rewards),
        "train/reward_direct": valid_mean(out.direct),
        "train/reward_reverse": valid_mean(out.reverse),
        "train/empty_candidates": (~valid).float().mean(),
        "train/advantage_std": step.advantages[valid].std(),
        "train/advantage_abs": valid_mean(step.advantages.abs()),
        "train/validity": torch.tensor([g.finished for g in gens], dtype=torch.float).mean(),
        "train/truncated": torch.tensor([g.truncated for g in gens], dtype=torch.float).mean(),
        "train/beam_best_share": (best == rewards.shape[-1] - 1).float().mean(),
        "train/identical_groups": identical.float().mean(),
        "train/candidate_tokens": torch.tensor(
            [len(g.token_ids) for g in gens], dtype=torch.float
        ).mean(),
        "train/log_valid_mass": valid_mean(sums("log_allowed_mass")),
        "train/kl_grammar": valid_mean(sums("logp_constrained") - out.ref_logp.to(device)),
        **{  # train.pairwise_weight > 0: the IPO term, its mean margin, the groups with a pair
            f"train/{name.replace('/', '_')}": value
            for name, value in step.parts.items()
            if "pairwise" in name
        },
    }


def rloo_sample(step: StepOutputs, global_step: int) -> dict[str, Any]:
    """The step's sample row (samples.jsonl): its first input, candidates and their rewards."""
    return {
        "step": global_step,
        "input": step.rollouts.examples[0].input,
        "candidates": [g.text for g in step.rollouts.groups[0]],
        "rewards": [round(v, 4) for v in step.rewards[0].tolist()],
    }
