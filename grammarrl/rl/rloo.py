"""RLOO advantages and the GrammarRL loss: pure functions over [prompts, candidates] tensors."""

from __future__ import annotations

import torch

# Where β·(log π_θ − log π_ref) enters (config `kl_penalty`): "loss" adds it to the loss, as the
# paper writes it (`grammarrl_loss`; its gradient is a uniform −β shift of every advantage, zero
# in expectation under on-policy sampling); "reward" subtracts it from the reward before RLOO
# (`kl_shaped_rewards`), the KL-regularised objective of RLOO in Ahmadian et al. (2024);
# "grammar" subtracts β·(log q_θ − log π_ref) from the reward instead, with q_θ the
# grammar-constrained policy the candidates were drawn from: in expectation KL(q_θ ‖ π_ref
# restricted to the grammar) up to a constant, whose regularised optimum is
# π_ref(y)·1[y ∈ L(G)]·exp(r(y)/β), the grammar posterior that importance sampling targets.


def combine_rewards(
    direct: torch.Tensor,
    reverse: torch.Tensor,
    lam: float,
    sigma_direct: float,
    sigma_reverse: float,
) -> torch.Tensor:
    """r = (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse."""
    return (1.0 - lam) * direct / sigma_direct + lam * reverse / sigma_reverse


def kl_shaped_rewards(
    rewards: torch.Tensor, policy_logp: torch.Tensor, ref_logp: torch.Tensor, beta: float
) -> torch.Tensor:
    """r_i − β·(log π_θ(y_i|x) − log π_ref(y_i|x)), without gradient (`kl_penalty=reward`;
    with the constrained log q_θ as `policy_logp`, `kl_penalty=grammar`)."""
    kl = policy_logp.detach() - ref_logp.detach().to(policy_logp.device)
    return rewards.detach().to(policy_logp.device) - beta * kl


def rloo_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """A_i = r_i − mean_{j≠i} r_j within each group (last dim: the N+1 candidates); no gradient.

    `valid` (bool, same shape) drops candidates from their groups: their advantage is 0 and
    they are left out of the others' baselines; a group with fewer than two valid candidates
    has no baseline and gets advantages 0."""
    rewards = rewards.detach()
    if rewards.shape[-1] < 2:
        raise ValueError("RLOO needs at least two candidates per group")
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    valid = valid.to(rewards.device)
    kept = rewards.masked_fill(~valid, 0.0)
    count = valid.sum(dim=-1, keepdim=True)
    others = (kept.sum(dim=-1, keepdim=True) - kept) / (count - 1).clamp(min=1)
    return (kept - others).masked_fill(~(valid & (count >= 2)), 0.0)


def grammarrl_loss(
    policy_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean over candidates of −A_i·log π_θ(y_i|x) + β·(log π_θ(y_i|x) − log π_ref(y_i|x)):
    with equal groups, the mean over prompts of 1/(N+1)·Σ_i [...], as in the paper.

    Log-probabilities are sequence sums of unconstrained token log-probs, shape [prompts, N+1].
    Candidates where `valid` is False are left out of the mean.
    """
    if valid is None:
        valid = torch.ones_like(policy_logp, dtype=torch.bool)
    weight = valid.to(policy_logp.device, policy_logp.dtype)
    count = weight.sum().clamp(min=1)
    kl = policy_logp - ref_logp.detach()
    pg = -advantages.detach() * policy_logp
    loss = ((pg + beta * kl) * weight).sum() / count
    return loss, {
        "loss/pg": ((pg * weight).sum() / count).detach(),
        "kl": ((kl * weight).sum() / count).detach(),
    }
