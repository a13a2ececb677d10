"""Rewards come from the frozen reference with unconstrained (not renormalised) probabilities."""

from __future__ import annotations

import pytest
import torch

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.decoding.scoring import common_prefix_length, sequence_logprobs
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import add_lora, reference_mode
from grammarrl.rl.reward import BidirectionalReward
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.search.potentials import ReversePotential
from grammarrl.types import Example
from tests.conftest import compose_config
from tests.support.tasks import WORDS, ToyTask


def _first_token_favourite(model, tokenizer, prompt):
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax().item()


def test_reward_uses_unconstrained_probabilities(tiny):
    model, tokenizer = tiny
    example = Example(uid="toy/0", input="The quick brown fox jumps.", target="alpha")
    task = ToyTask(WORDS)
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    favourite = _first_token_favourite(model, tokenizer, prompt)
    allowed_first = {tokenizer.encode(w, add_special_tokens=False)[0] for w in WORDS}
    assert favourite not in allowed_first  # the grammar masks the model's favourite token

    gen = ConstrainedDecoder(model, tokenizer, task.grammar(), max_new_tokens=8).greedy([prompt])[0]
    assert gen.finished and gen.text in WORDS
    scores = ReferenceScorer(model, tokenizer, task).score(
        example, prompt, [gen.token_ids], [gen.text]
    )
    teacher = sequence_logprobs(model, [prompt + gen.token_ids], [len(prompt)])[0]
    assert scores.direct.item() == pytest.approx(teacher.mean().item(), abs=1e-5)
    assert scores.ref_logp.item() == pytest.approx(teacher.sum().item(), abs=1e-4)
    assert scores.direct.item() == pytest.approx(
        sum(gen.logp_unconstrained) / gen.num_tokens, abs=1e-4
    )
    # renormalised probabilities would be much higher: the mask removed the favourite token
    assert scores.ref_logp.item() < gen.sum_logp_constrained - 1.0


def test_reverse_reward_scores_the_input_given_the_candidate(tiny):
    model, tokenizer = tiny
    task = ToyTask(WORDS)
    example = Example(uid="toy/1", input="Gamma rays are energetic.", target="gamma")
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    cands = [tokenizer.encode(w, add_special_tokens=False) + [2] for w in ("gamma", "omega")]
    scorer = ReferenceScorer(model, tokenizer, task)
    shared = scorer.score(example, prompt, cands, ["gamma", "omega"])
    plain = ReferenceScorer(model, tokenizer, task, share_prefix=False).score(
        example, prompt, cands, ["gamma", "omega"]
    )
    x_ids = tokenizer.encode(example.input, add_special_tokens=False)
    for i, word in enumerate(["gamma", "omega"]):
        rev = encode_prompt(tokenizer, task.reverse_messages(word))
        expected = sequence_logprobs(model, [rev + x_ids], [len(rev)], share_prefix=False)[0]
        assert expected.shape[0] == len(x_ids)
        assert shared.reverse[i].item() == pytest.approx(expected.mean().item(), abs=1e-5)
    assert torch.allclose(shared.direct, plain.direct, atol=1e-5)
    assert torch.allclose(shared.reverse, plain.reverse, atol=1e-5)


def test_reference_ignores_the_adapter(tiny, cache_dir):
    from grammarrl.models.loading import load_model

    cfg = compose_config(["model=tiny"])
    base, tokenizer = load_model(cfg.model, cache_dir, device="cpu")
    task = ToyTask(WORDS)
    example = Example(uid="toy/2", input="Delta of a river.", target="delta")
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    cands = [tokenizer.encode("delta", add_special_tokens=False) + [2]]
    before = ReferenceScorer(base, tokenizer, task).score(example, prompt, cands, ["delta"])
    policy = add_lora(base, cfg.lora)
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    after = ReferenceScorer(policy, tokenizer, task).score(example, prompt, cands, ["delta"])
    assert torch.allclose(before.direct, after.direct, atol=1e-5)
    assert torch.allclose(before.reverse, after.reverse, atol=1e-5)
    with torch.no_grad():
        policy_logp = sequence_logprobs(policy, [prompt + cands[0]], [len(prompt)])[0].sum()
    assert abs(policy_logp.item() - after.ref_logp.item()) > 1e-3  # the policy itself differs
    with reference_mode(policy), torch.no_grad():
        ref_logp = sequence_logprobs(policy, [prompt + cands[0]], [len(prompt)])[0].sum()
    assert ref_logp.item() == pytest.approx(after.ref_logp.item(), abs=1e-4)


def test_the_static_part_of_forward_prompts_is_run_once_and_scores_stay_exact(tiny):
    """After two different inputs, the forward prompts' common part is cached under pi_ref; the
    scores equal those of a scorer that shares nothing, and a prompt that shares less shortens
    the cached part instead of being scored against it."""
    model, tokenizer = tiny
    task = ToyTask(WORDS)
    examples = [
        Example(uid=f"toy/{i}", input=text, target="alpha")
        for i, text in enumerate(["Alpha waves.", "A beta test.", "Gamma rays are energetic."])
    ]
    prompts = [encode_prompt(tokenizer, task.forward_messages(ex)) for ex in examples]
    other = list(prompts[2])
    other[3] = (other[3] + 1) % len(tokenizer)  # shares 3 tokens only
    cands = [tokenizer.encode(w, add_special_tokens=False) + [2] for w in ("alpha", "beta")]
    cached, plain = (
        ReferenceScorer(model, tokenizer, task),
        ReferenceScorer(model, tokenizer, task, share_prefix=False),
    )
    static = common_prefix_length(prompts[:2])
    assert static > 10  # the toy task's system prompt and demonstrations
    for i, (example, prompt) in enumerate(zip([*examples, examples[2]], [*prompts, other])):
        got = cached.score(example, prompt, cands, ["alpha", "beta"])
        want = plain.score(example, prompt, cands, ["alpha", "beta"])
        assert torch.allclose(got.direct, want.direct, atol=1e-5)
        assert torch.allclose(got.ref_logp, want.ref_logp, atol=1e-4)
        expected = [None, static, static, 3][i]
        prefix = cached.forward_static_prefix(prompt)
        assert (prefix and len(prefix.tokens)) == expected


def test_outputs_that_merge_with_the_reverse_template_are_scored_without_the_static_prefix(tiny):
    """Leading spaces or a blank line merge with the reverse template's last token, so such a
    reverse prompt does not start with the static prefix (tokenized from stand-in outputs): its
    row is scored without it, in the candidates' order, exactly as without sharing."""
    model, tokenizer = tiny
    task = ToyTask(WORDS)
    example = Example(uid="toy/3", input="Alpha waves.", target="alpha")
    texts = ["  ab", "A", "\n\nx", "  cd"]
    shared, plain = (
        ReferenceScorer(model, tokenizer, task),
        ReferenceScorer(model, tokenizer, task, share_prefix=False),
    )
    static = shared.reverse_static_prefix().tokens
    reverse = [encode_prompt(tokenizer, task.reverse_messages(t)) for t in texts]
    assert [r[: len(static)] == static for r in reverse] == [False, True, False, False]
    got, positions = shared.reverse_logprobs(example, texts)
    want, _ = plain.reverse_logprobs(example, texts)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)
    potential = ReversePotential(BidirectionalReward(shared))  # the search's, too
    assert potential.complete(example, texts) == pytest.approx(
        [float(w.sum()) for w in want], abs=1e-3
    )
    assert potential.forward_tokens == positions
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    cands = [tokenizer.encode(t, add_special_tokens=False) + [2] for t in texts]
    scores = shared.score(example, prompt, cands, texts)
    assert torch.allclose(scores.reverse, plain.score(example, prompt, cands, texts).reverse)
    # accounting: the fitting row runs after the cached prefix, the others on their own
    fitting = shared.reverse_logprobs(example, ["A"])[1]
    assert fitting == len(reverse[1]) + len(shared.input_ids(example)) - len(static)
    assert positions == fitting + shared.reverse_logprobs(example, ["  ab", "\n\nx", "  cd"])[1]
