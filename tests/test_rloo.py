"""RLOO advantages, reward mixing and the GrammarRL loss (pure functions, tiny model)."""

from __future__ import annotations

import pytest
import torch

from grammarrl.decoding.scoring import sequence_logprobs
from grammarrl.models.loading import (
    add_lora,
    enable_activation_checkpointing,
    load_model,
    reference_mode,
)
from grammarrl.rl.rloo import combine_rewards, grammarrl_loss, kl_shaped_rewards, rloo_advantages
from tests.conftest import compose_config


def test_leave_one_out_baseline_by_hand():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    # A_i = r_i - mean of the other three
    expected = torch.tensor([[1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0]])
    assert torch.allclose(rloo_advantages(r), expected)


def test_advantages_are_per_group_and_carry_no_gradient():
    r = torch.tensor([[0.0, 0.0, 0.0, 4.0], [5.0, 5.0, 5.0, 5.0]], requires_grad=True)
    a = rloo_advantages(r)
    assert not a.requires_grad
    assert torch.allclose(a[1], torch.zeros(4))  # equal rewards: no signal
    assert a[0, 3] == pytest.approx(4.0) and a[0, 0] == pytest.approx(-4 / 3)


def test_invalid_candidates_are_dropped_from_their_group():
    """An empty candidate (valid=False) gets advantage 0 and is out of the others' baseline and
    of the loss; a group left with one valid candidate has no baseline."""
    r = torch.tensor([[1.0, 2.0, 99.0, 6.0], [3.0, 99.0, 99.0, 99.0]])
    valid = torch.tensor([[True, True, False, True], [True, False, False, False]])
    a = rloo_advantages(r, valid)
    assert torch.allclose(a[0], torch.tensor([1 - 4.0, 2 - 3.5, 0.0, 6 - 1.5]))
    assert torch.equal(a[1], torch.zeros(4))
    assert torch.equal(rloo_advantages(r[:1, [0, 1, 3]])[0], a[0, [0, 1, 3]])

    logp = torch.tensor([[-1.0, -2.0, 0.0, -3.0], [-1.0, 0.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, 0.0, -3.0], [-1.0, 0.0, 0.0, 0.0]])
    loss, parts = grammarrl_loss(logp, ref, a, beta=0.1, valid=valid)
    terms = [-a[0, 0] * -1.0 + 0.1 * 0.5, -a[0, 1] * -2.0, -a[0, 3] * -3.0, 0.0]
    assert loss.item() == pytest.approx(sum(terms) / 4)  # 4 valid candidates
    assert parts["kl"].item() == pytest.approx(0.5 / 4)


def test_an_empty_candidate_scores_nothing_and_leaves_the_others_unchanged(tiny_policy):
    prompt, cands = _candidates()
    for share in (True, False):
        with_empty = sequence_logprobs(
            tiny_policy, [prompt + c for c in [[], *cands]], [len(prompt)] * 4, share_prefix=share
        )
        alone = sequence_logprobs(
            tiny_policy, [prompt + c for c in cands], [len(prompt)] * 3, share_prefix=share
        )
        assert with_empty[0].numel() == 0
        for got, expected in zip(with_empty[1:], alone):
            torch.testing.assert_close(got, expected)


def test_combine_rewards_scales_each_term():
    d, r = torch.tensor([-2.0]), torch.tensor([-0.5])
    assert combine_rewards(d, r, 0.0, 2.0, 0.25).item() == pytest.approx(-1.0)
    assert combine_rewards(d, r, 1.0, 2.0, 0.25).item() == pytest.approx(-2.0)
    assert combine_rewards(d, r, 0.5, 2.0, 0.25).item() == pytest.approx(-1.5)


def test_loss_value_by_hand():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, parts = grammarrl_loss(logp, ref, adv, beta=0.1)
    # 1/2 * [(-1*-1 + 0.1*0.5) + (1*-2 + 0)] = 1/2 * (1.05 - 2) = -0.475
    assert loss.item() == pytest.approx(-0.475)
    assert parts["kl"].item() == pytest.approx(0.25)


def test_the_papers_kl_term_only_shifts_every_advantage_by_minus_beta():
    """d loss / d log pi_theta(y_i) = (−A_i + β)/n: the loss-form KL term adds no per-candidate
    signal (why `kl_penalty=reward` exists)."""
    logp = torch.tensor([[-1.0, -2.0, -4.0]], requires_grad=True)
    ref = torch.tensor([[-3.0, -2.0, -1.0]])
    adv = torch.tensor([[0.5, -0.2, -0.3]])
    grammarrl_loss(logp, ref, adv, beta=0.1)[0].backward()
    torch.testing.assert_close(logp.grad, (-adv + 0.1) / 3)


def test_kl_shaped_rewards_penalise_each_candidate_by_its_own_log_ratio():
    rewards = torch.tensor([[1.0, 1.0, 0.0]])
    logp = torch.tensor([[-1.0, -3.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-3.0, -3.0, -1.0]])
    shaped = kl_shaped_rewards(rewards, logp, ref, beta=0.5)
    torch.testing.assert_close(shaped, torch.tensor([[0.0, 1.0, 0.5]]))
    assert not shaped.requires_grad
    # equal task rewards, different log-ratios: the candidate further from pi_ref loses
    assert rloo_advantages(shaped)[0, 0] < rloo_advantages(shaped)[0, 1]


def _candidates():
    prompt = [1, 520, 33, 97, 2, 1, 314]
    return prompt, [[45, 46, 2], [47, 2], [48, 49, 50, 2]]


def _policy_logp(policy, prompt, cands):
    rows = sequence_logprobs(policy, [prompt + c for c in cands], [len(prompt)] * len(cands))
    return torch.stack([r.sum() for r in rows]).unsqueeze(0)


@pytest.fixture
def tiny_policy(cache_dir):
    cfg = compose_config(["model=tiny", "lora.dropout=0.0"])
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    torch.manual_seed(0)  # LoRA A is randomly initialised
    policy = add_lora(model.double(), cfg.lora)
    policy.eval()
    return policy


def test_kl_term_is_zero_at_step_zero(tiny_policy):
    prompt, cands = _candidates()
    logp = _policy_logp(tiny_policy, prompt, cands)
    with reference_mode(tiny_policy), torch.no_grad():
        ref = _policy_logp(tiny_policy, prompt, cands)
    _, parts = grammarrl_loss(logp, ref, torch.zeros_like(logp), beta=0.02)
    assert parts["kl"].item() == 0.0


def test_loss_gradient_matches_finite_differences(tiny_policy):
    torch.manual_seed(0)
    with torch.no_grad():  # move off the LoRA init (B=0) so every path carries gradient
        for name, p in tiny_policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    prompt, cands = _candidates()
    with reference_mode(tiny_policy), torch.no_grad():
        ref = _policy_logp(tiny_policy, prompt, cands)
    adv = torch.tensor([[0.7, -0.2, -0.5]], dtype=torch.float64)

    def loss_fn():
        return grammarrl_loss(_policy_logp(tiny_policy, prompt, cands), ref, adv, beta=0.02)[0]

    name, param = next(
        (n, p) for n, p in tiny_policy.named_parameters() if "lora_A" in n and "q_proj" in n
    )
    loss_fn().backward()
    analytic = param.grad[0, :3].clone()
    eps = 1e-3  # RMSNorm and rotary run in float32 inside the model: a larger step
    numeric = []
    for j in range(3):
        with torch.no_grad():
            param[0, j] += eps
            up = loss_fn().item()
            param[0, j] -= 2 * eps
            down = loss_fn().item()
            param[0, j] += eps
        numeric.append((up - down) / (2 * eps))
    assert torch.allclose(
        analytic, torch.tensor(numeric, dtype=torch.float64), rtol=1e-2, atol=1e-6
    ), name


def test_gradient_same_packed_padded_and_checkpointed(tiny_policy):
    """The packed shared-prefix pass, one padded row per candidate, and gradient checkpointing
    (which recomputes the packed pass in backward) give the same gradients."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in tiny_policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    prompt, cands = _candidates()

    def gradients(share: bool) -> dict[str, torch.Tensor]:
        tiny_policy.zero_grad()
        rows = sequence_logprobs(
            tiny_policy, [prompt + c for c in cands], [len(prompt)] * len(cands), share_prefix=share
        )
        torch.stack([r.sum() for r in rows]).sum().backward()
        return {n: p.grad.clone() for n, p in tiny_policy.named_parameters() if p.requires_grad}

    padded, packed = gradients(False), gradients(True)
    enable_activation_checkpointing(tiny_policy)
    tiny_policy.train()
    checkpointed = gradients(True)
    assert tiny_policy.base_model.model.model.layers[0].gradient_checkpointing
    assert any(g.abs().sum() > 0 for g in packed.values())
    for name in padded:
        assert torch.allclose(packed[name], padded[name], rtol=1e-4, atol=1e-5), (
            name
        )  # float32 norms
        assert torch.allclose(checkpointed[name], packed[name], atol=1e-10), name
