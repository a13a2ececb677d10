"""Best against worst within each RLOO group (`train.pairwise_weight`, grammarrl/rl/preference.py):
which candidates pair, the IPO loss and its gradient, and the RLOO step with and without it."""

from __future__ import annotations

import pytest
import torch

from grammarrl.config.checks import check_values
from grammarrl.errors import ConfigError
from grammarrl.rl.preference import best_and_worst, ipo_loss
from grammarrl.rl.rloo import grammarrl_loss, rloo_advantages
from grammarrl.training.rloo_metrics import rloo_metrics
from tests.conftest import compose_config
from tests.support.steps import step_module


def test_each_group_pairs_its_highest_and_lowest_valid_reward():
    rewards = torch.tensor([[1.0, 3.0, 2.0, 0.5], [2.0, 2.0, 2.0, 2.0], [5.0, 1.0, 0.0, 9.0]])
    valid = torch.tensor([[True] * 4, [True] * 4, [True, True, True, False]])
    best, worst, paired = best_and_worst(rewards, valid)
    assert best.tolist() == [1, 0, 0] and worst.tolist() == [3, 0, 2]  # 9.0 is not valid
    assert paired.tolist() == [True, False, True]  # equal rewards: no preference
    one_valid = torch.tensor([[True, False, False, False]] * 3)
    assert not best_and_worst(rewards, one_valid)[2].any()


def test_ipo_loss_is_the_squared_gap_of_the_log_ratio_margin_to_one_over_two_tau():
    policy = torch.tensor([[-2.0, -1.0, -3.0], [-1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-2.5, -1.5, -2.0], [-1.0, -1.0, -1.0]])
    rewards = torch.tensor([[0.0, 1.0, -1.0], [1.0, 1.0, 1.0]])  # group 1 has no pair
    valid = torch.ones_like(rewards, dtype=torch.bool)
    loss, parts = ipo_loss(policy, ref, rewards, valid, tau=0.25)
    margin = (-1.0 + 1.5) - (-3.0 + 2.0)  # best: candidate 1, worst: candidate 2
    assert parts["pairwise/margin"].item() == pytest.approx(margin)
    assert loss.item() == pytest.approx((margin - 2.0) ** 2)
    assert parts["pairwise/groups"].item() == pytest.approx(0.5)
    loss.backward()  # margin below 1/(2τ) = 2: raise the best's log-prob, lower the worst's
    grad = policy.grad[0].tolist()
    assert grad[1] < 0 < grad[2] and grad[0] == 0 and not policy.grad[1].any()


def test_a_step_without_pairs_contributes_zero_and_still_backpropagates():
    policy = torch.zeros(2, 3, requires_grad=True)
    loss, parts = ipo_loss(policy, torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3) > 0, 0.1)
    loss.backward()
    assert loss.item() == 0 and parts["pairwise/groups"].item() == 0 and not policy.grad.any()


def test_the_rloo_step_adds_the_weighted_term_and_is_rloo_alone_when_off(tiny):
    """Off (the default): the step's loss is RLOO's alone and no pairwise metric is logged.
    On: the same rollouts (the same rewards) and RLOO's loss plus weight × the IPO term of
    those rollouts."""
    off_module, batch = step_module(tiny, [])
    off = off_module.step_loss(batch)
    out = off.rollouts
    advantages = rloo_advantages(off.rewards, out.valid)
    rloo, _ = grammarrl_loss(off.policy_logp, out.ref_logp, advantages, 0.02, out.valid)
    assert torch.equal(off.loss, rloo)
    identical = torch.zeros(len(batch), dtype=torch.bool)
    assert not [k for k in rloo_metrics(off, identical) if "pairwise" in k]

    on_module, batch = step_module(tiny, ["train.pairwise_weight=0.5", "train.pairwise_tau=0.2"])
    on = on_module.step_loss(batch)
    assert torch.equal(on.rewards, off.rewards)  # the term adds no rollout
    ipo, _ = ipo_loss(on.policy_logp, on.rollouts.ref_logp, on.rewards, on.rollouts.valid, 0.2)
    assert ipo.item() > 0
    torch.testing.assert_close(on.loss, rloo + 0.5 * ipo)
    logged = rloo_metrics(on, identical)
    assert {"train/loss_pairwise", "train/pairwise_margin", "train/pairwise_groups"} <= {*logged}


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["train.pairwise_weight=-1"], "train.pairwise_weight"),
        (["train.pairwise_tau=0"], "train.pairwise_tau"),
        (
            ["train.pairwise_weight=0.5", "train.objective=amortised_is"],
            "train.pairwise_weight=0.5 applies to train.objective=rloo only",
        ),
    ],
)
def test_bad_pairwise_settings_are_refused_naming_the_key(overrides, says):
    with pytest.raises(ConfigError, match=says):
        check_values(compose_config(["model=tiny", "mode=train", *overrides]))
