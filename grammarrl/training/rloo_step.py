"""One RLOO step up to its loss (`train.objective=rloo`, the paper): rollout groups scored with
the reward (`reward._target_`) by the frozen reference, RLOO advantages, the GrammarRL loss; with
`train.pairwise_weight` > 0, plus that weight times the IPO loss of each group's best against its
worst candidate (`grammarrl.rl.preference`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grammarrl.rl.preference import ipo_loss
from grammarrl.rl.rloo import grammarrl_loss, kl_shaped_rewards, rloo_advantages
from grammarrl.rl.rollout import RolloutBatch, collect_rollouts
from grammarrl.runs.timing import clock
from grammarrl.training.policy import (
    StepModels,
    policy_logp,
    policy_train_mode,
    summed_per_candidate,
)
from grammarrl.training.settings import StepSettings
from grammarrl.types import Example


@dataclass
class StepOutputs:
    """What one RL step computed before backward."""

    rollouts: RolloutBatch
    rewards: torch.Tensor  # [inputs, N+1]
    advantages: torch.Tensor  # [inputs, N+1]
    policy_logp: torch.Tensor  # [inputs, N+1], log pi_theta(y|x) with gradient
    loss: torch.Tensor
    parts: dict[str, torch.Tensor]
    seconds: dict[str, float]  # wall time per phase: rollout, scoring, policy


def rloo_step_loss(
    batch: list[Example], models: StepModels, settings: StepSettings, generator: torch.Generator
) -> StepOutputs:
    """One RL step up to the loss: rollouts and reference scores without gradient, rewards,
    log pi_theta with gradient from the same deterministic policy that rolled out (LoRA
    dropout only with `train.policy_dropout`), RLOO advantages (of the rewards less
    β·KL with `kl_penalty=reward` or `grammar`), the loss. `rewards` are the task rewards
    alone."""
    policy = models.policy
    policy.eval()  # rollouts and reference scoring without dropout
    with torch.no_grad():
        out = collect_rollouts(
            models.decoder,
            models.reward,
            models.tokenizer,
            models.task,
            batch,
            settings.rollout,
            generator,
        )
    rewards = settings.mixing.combine(out.direct, out.reverse)
    policy_train_mode(policy, dropout=settings.policy_dropout)
    started = clock()
    logp = policy_logp(policy, out.prompts, out.groups, settings.share_prefix)
    seconds = {**out.seconds, "policy": clock() - started}
    ref_logp = out.ref_logp.to(logp.device)
    beta, shaped = settings.beta, rewards
    if settings.kl_penalty != "loss":  # β·KL in each candidate's reward, none in the loss
        own = logp  # "reward": the unconstrained log π_θ; "grammar": log q_θ
        if settings.kl_penalty == "grammar":
            own = summed_per_candidate(out.groups, "logp_constrained").to(ref_logp.device)
        shaped, beta = kl_shaped_rewards(rewards, own, ref_logp, beta), 0.0
    advantages = rloo_advantages(shaped, out.valid).to(logp.device)
    loss, parts = grammarrl_loss(logp, ref_logp, advantages, beta, out.valid)
    if settings.pairwise_weight > 0:  # ranked by the task reward; the KL acts through π_ref
        pairwise, pair_parts = ipo_loss(logp, ref_logp, rewards, out.valid, settings.pairwise_tau)
        loss, parts = loss + settings.pairwise_weight * pairwise, {**parts, **pair_parts}
    return StepOutputs(out, rewards, advantages, logp, loss, parts, seconds)
