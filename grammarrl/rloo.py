"""RLOO advantages and the GrammarRL loss: pure functions over [prompts, candidates] tensors."""

from __future__ import annotations

import torch


def combine_rewards(direct: torch.Tensor, reverse: torch.Tensor, lam: float,
                    sigma_direct: float, sigma_reverse: float) -> torch.Tensor:
    """r = (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse."""
    return (1.0 - lam) * direct / sigma_direct + lam * reverse / sigma_reverse


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = r_i − mean_{j≠i} r_j within each group (last dim: the N+1 candidates); no gradient."""
    rewards = rewards.detach()
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("RLOO needs at least two candidates per group")
    others = (rewards.sum(dim=-1, keepdim=True) - rewards) / (k - 1)
    return rewards - others


def grammarrl_loss(policy_logp: torch.Tensor, ref_logp: torch.Tensor, advantages: torch.Tensor,
                   beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean over prompts of 1/(N+1)·Σ_i [−A_i·log π_θ(y_i|x) + β·(log π_θ(y_i|x) − log π_ref(y_i|x))].

    Log-probabilities are sequence sums of unconstrained token log-probs, shape [prompts, N+1].
    """
    kl = policy_logp - ref_logp.detach()
    pg = -advantages.detach() * policy_logp
    loss = (pg + beta * kl).mean()
    return loss, {"loss/pg": pg.mean().detach(), "kl": kl.mean().detach()}
