"""The RL step of GrammarRLModule on the tiny model: which policy the loss's log pi_theta is."""

from __future__ import annotations

import copy

import pytest
import torch

from grammarrl.decoding.scoring import sequence_logprobs
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import add_lora
from grammarrl.rl.rloo import rloo_advantages
from grammarrl.tasks import load_task
from grammarrl.training.module import GrammarRLModule
from grammarrl.training.settings import StepSettings
from tests.conftest import compose_config

STEP = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    "lora.dropout=0.5",
    "task.max_new_tokens=24",
    "rollout.num_samples=2",
    "rollout.beam_width=2",
]


def make_module(tiny, overrides: list[str], trained: bool) -> tuple[GrammarRLModule, list]:
    """A module over a fresh LoRA copy of the tiny model; `trained`: a non-zero adapter (LoRA B
    starts at zero, which would hide any dropout)."""
    cfg = compose_config([*STEP, *overrides])
    torch.manual_seed(0)
    policy = add_lora(copy.deepcopy(tiny[0]), cfg.lora)
    if trained:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    task = load_task(cfg)
    module = GrammarRLModule(policy, tiny[1], task, StepSettings.from_config(cfg, 1.0, 1.0))
    module.setup("fit")
    return module, task.splits().train[:2]


def deterministic_logp(module: GrammarRLModule, step) -> torch.Tensor:
    """log pi_theta of the step's candidates, recomputed in eval mode (no dropout at all)."""
    module.policy.eval()
    with torch.no_grad():
        rows = []
        for prompt, group in zip(step.rollouts.prompts, step.rollouts.groups):
            logp = sequence_logprobs(
                module.policy, [prompt + g.token_ids for g in group], [len(prompt)] * len(group)
            )
            rows.append(torch.stack([lp.sum() for lp in logp]))
    return torch.stack(rows)


def test_step_zero_policy_equals_reference_and_kl_is_zero(tiny):
    module, batch = make_module(tiny, [], trained=False)
    step = module.step_loss(batch)
    assert [g.kind for g in step.rollouts.groups[0]] == ["sample", "sample", "beam"]
    assert torch.equal(step.policy_logp.detach(), step.rollouts.ref_logp)
    assert step.parts["kl"].item() == 0.0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_policy_pass_uses_the_rollout_policy_without_dropout(tiny, checkpointing):
    """With lora.dropout=0.5 and a non-zero adapter, log pi_theta in the loss equals the
    deterministic policy's (the one that rolled out), with gradient checkpointing too."""
    module, batch = make_module(
        tiny, [f"train.gradient_checkpointing={str(checkpointing).lower()}"], trained=True
    )
    seen = []
    layer = module.policy.base_model.model.model.layers[0]
    hook = layer.register_forward_pre_hook(lambda mod, args: seen.append(mod.training))
    try:
        step = module.step_loss(batch)
    finally:
        hook.remove()
    assert seen[-1] is True  # the policy pass runs in training mode: checkpointing applies
    assert step.policy_logp.requires_grad
    torch.testing.assert_close(
        step.policy_logp.detach(), deterministic_logp(module, step), rtol=0, atol=1e-5
    )
    step.loss.backward()
    grads = [p.grad for p in module.policy.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_policy_dropout_switch_turns_lora_dropout_back_on(tiny):
    """train.policy_dropout=true: the documented effect of lora.dropout, a noisy log pi_theta."""
    module, batch = make_module(tiny, ["train.policy_dropout=true"], trained=True)
    step = module.step_loss(batch)
    difference = (step.policy_logp.detach() - deterministic_logp(module, step)).abs().max()
    assert difference > 1e-2


def test_an_empty_beam_candidate_is_dropped_through_reward_and_loss(tiny):
    """A grammar whose preferred branch dead-ends: the greedy-like beam (B=1) finds no output,
    and the rollout -> reward -> loss path drops that empty candidate from its group."""
    from grammarrl.decoding import ConstrainedDecoder

    module, batch = make_module(
        tiny, ["rollout.beam_width=1", "rollout.num_samples=6"], trained=False
    )
    probe = ConstrainedDecoder(module.policy, tiny[1], 'start: "1" | "2"', max_new_tokens=4)
    prompts = [encode_prompt(tiny[1], module.task.forward_messages(ex)) for ex in batch]
    first = [g.text for g in probe.greedy(prompts)]
    assert first[0] == first[1]  # the tiny model prefers the same digit for both inputs
    bad, good = first[0], "2" if first[0] == "1" else "1"
    module.decoder = ConstrainedDecoder(
        module.policy, tiny[1], f'start: "{good}" | "{bad}" " " A\nA: /a/ & /b/', max_new_tokens=8
    )
    step = module.step_loss(batch)
    beams = [group[-1] for group in step.rollouts.groups]
    assert all(b.token_ids == [] and b.error == "no beam survived" for b in beams)
    assert not step.rollouts.valid[:, -1].any() and step.rollouts.valid[:, :-1].all()
    assert torch.isfinite(step.loss) and torch.equal(step.advantages[:, -1], torch.zeros(2))
    expected = rloo_advantages(step.rewards[:, :-1])  # RLOO over the six samples alone
    torch.testing.assert_close(step.advantages[:, :-1], expected)
    step.loss.backward()


def test_kl_penalty_in_the_reward_moves_beta_from_the_loss_into_the_advantages(tiny):
    """kl_penalty=reward: advantages are RLOO of r − β·(log pi_theta − log pi_ref), the loss has
    no β term, and the logged rewards stay the task rewards."""
    overrides = ["beta=0.5", "kl_penalty=reward"]
    module, batch = make_module(tiny, overrides, trained=True)
    step = module.step_loss(batch)
    kl = step.policy_logp.detach() - step.rollouts.ref_logp
    assert kl.abs().max() > 1e-3  # a trained adapter: the penalty is not zero
    torch.testing.assert_close(step.advantages, rloo_advantages(step.rewards - 0.5 * kl))
    valid = step.rollouts.valid
    expected = -(step.advantages * step.policy_logp)[valid].mean()
    torch.testing.assert_close(step.loss, expected)
    torch.testing.assert_close(step.parts["kl"], kl[valid].mean())


def test_kl_penalty_grammar_measures_the_constrained_policy_against_the_reference(tiny):
    """kl_penalty=grammar: advantages are RLOO of r − β·(log q_θ − log π_ref), q_θ the
    grammar-constrained policy (its log-prob: the teacher-forced log π_θ less the log mass on
    the allowed tokens); not kl_penalty=reward's unconstrained log π_θ; no β term in the loss."""
    from grammarrl.training.policy import summed_per_candidate

    module, batch = make_module(tiny, ["beta=0.5", "kl_penalty=grammar"], trained=True)
    step = module.step_loss(batch)
    log_allowed = summed_per_candidate(step.rollouts.groups, "log_allowed_mass")
    policy_logp, ref_logp = step.policy_logp.detach(), step.rollouts.ref_logp
    kl = policy_logp - log_allowed - ref_logp
    assert (log_allowed.abs() > 1e-3).all()  # differs from the unconstrained penalty
    expected = rloo_advantages(step.rewards - 0.5 * kl)
    torch.testing.assert_close(step.advantages, expected, rtol=0, atol=1e-4)
    valid = step.rollouts.valid
    torch.testing.assert_close(step.loss, -(step.advantages * step.policy_logp)[valid].mean())


def test_log_valid_mass_of_a_forced_output_is_its_sequence_log_prob(tiny):
    """A grammar with one output: every step allows one token, so the policy's log mass on the
    allowed tokens, summed, is log pi_theta(y|x) as the teacher-forced policy pass computes it."""
    from grammarrl.decoding import ConstrainedDecoder
    from grammarrl.training.policy import summed_per_candidate

    module, batch = make_module(tiny, [], trained=True)
    module.decoder = ConstrainedDecoder(module.policy, tiny[1], 'start: "1"', max_new_tokens=4)
    step = module.step_loss(batch)
    mass = summed_per_candidate(step.rollouts.groups, "log_allowed_mass")
    assert mass.shape == step.policy_logp.shape and (mass < 0).all()
    torch.testing.assert_close(mass, step.policy_logp.detach(), rtol=0, atol=1e-4)


def test_identical_groups_and_the_no_signal_warning():
    """A group whose valid candidates are all the same output has no RLOO signal; stretches of
    steps where every group is like that are reported once each, with their step range."""
    from types import SimpleNamespace

    from grammarrl.training.rloo_metrics import SignalWatch, identical_groups

    def gen(*ids):
        return SimpleNamespace(token_ids=list(ids))

    groups = [
        [gen(1, 2), gen(1, 2), gen(1, 2)],  # identical
        [gen(1, 2), gen(1, 3), gen(1, 2)],  # differ
        [gen(5), gen(), gen(5)],  # identical once the empty one is dropped
        [gen(7), gen(), gen()],
    ]  # one valid candidate: nothing to compare
    valid = torch.tensor([[True] * 3, [True] * 3, [True, False, True], [True, False, False]])
    assert identical_groups(groups, valid).tolist() == [True, False, True, True]

    watch = SignalWatch()
    reports = [
        watch.update(step, silent) for step, silent in enumerate([False, True, True, False, True])
    ]
    assert reports[:3] == [None, None, None] and reports[4] is None
    assert reports[3].startswith("steps 1-2:")
    assert watch.flush().startswith("steps 4-4:") and watch.flush() is None
