"""Best against worst within each RLOO group (`train.pairwise_weight`; Evidence IV's second
route, after BoNBoN's preference term): an IPO loss on each group's highest- and lowest-reward
candidates, their log-ratios taken against the frozen reference. It reuses the step's rollouts
and log-probabilities: no forward pass more than RLOO's."""

from __future__ import annotations

import torch


def best_and_worst(
    rewards: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group (last dim) the index of its highest- and of its lowest-reward valid candidate
    (the first on ties), and whether the group has a pair: two valid candidates whose rewards
    differ."""
    valid = valid.to(rewards.device)
    best = rewards.masked_fill(~valid, float("-inf")).argmax(dim=-1)
    worst = rewards.masked_fill(~valid, float("inf")).argmin(dim=-1)
    high = rewards.gather(-1, best[..., None]).squeeze(-1)
    low = rewards.gather(-1, worst[..., None]).squeeze(-1)
    paired = (valid.sum(dim=-1) >= 2) & (high > low)
    return best, worst, paired


def ipo_loss(
    policy_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    rewards: torch.Tensor,
    valid: torch.Tensor,
    tau: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean over the groups with a pair of (h − 1/(2τ))², h = [log π_θ − log π_ref](best) −
    [log π_θ − log π_ref](worst) (IPO, Azar et al. 2024); 0 when no group has one. Shapes
    [prompts, candidates]; rewards and the reference carry no gradient."""
    device = policy_logp.device  # the rollouts' rewards may live on another (the reference's)
    best, worst, paired = best_and_worst(rewards.detach().to(device), valid)
    ratio = policy_logp - ref_logp.detach().to(device)
    margin = ratio.gather(-1, best[..., None]) - ratio.gather(-1, worst[..., None])
    margin = margin.squeeze(-1)[paired]
    if margin.numel() == 0:
        zero = policy_logp.sum() * 0.0  # keeps the graph: backward works on a step without pairs
        return zero, {"loss/pairwise": zero.detach(), "pairwise/groups": zero.detach()}
    loss = ((margin - 1.0 / (2.0 * tau)) ** 2).mean()
    return loss, {
        "loss/pairwise": loss.detach(),
        "pairwise/margin": margin.mean().detach(),
        "pairwise/groups": paired.float().mean().detach(),
    }
