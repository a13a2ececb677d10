"""CUDA against CPU, both in float32, on the `tiny` model: constrained greedy, sampling and beam
search, the cascade rollout, reward scoring and one RL step give the same tokens, and
log-probabilities within the tolerances below. The `cuda` parameters run with `pytest -m cuda`
(`python -m benchmarks.device` runs them on a GPU) and skip without CUDA; the `cpu` parameters
run the same comparison CPU against CPU in the ordinary suite, so the harness cannot rot.

Tolerances (float32 on both; CUDA sums in another order, and its attention kernels differ):
per-token log-probabilities within 1e-4 nats; sums over a sequence (rewards, log pi of a
candidate) within 1e-3 nats or 1e-4 relative; LoRA weights after one AdamW step within 1e-5."""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.device_setup import assets_dir, load_carried_tokenizer
from grammarrl.decoding import ConstrainedDecoder
from grammarrl.decoding.cascade import supports_cascade
from grammarrl.models.chat import encode_prompt, end_of_turn_id
from grammarrl.models.loading import add_lora, build_tiny
from grammarrl.rl.rewards import ReferenceScorer
from grammarrl.tasks import load_task
from grammarrl.training.module import GrammarRLModule
from grammarrl.training.settings import StepSettings
from tests.conftest import compose_config
from tests.support.decoding import JSON_GRAMMAR, MESSAGES
from tests.support.devices import DEVICES

TOKEN_ATOL = 1e-4
SUM_ATOL, SUM_RTOL = 1e-3, 1e-4
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-3
CONFIG = [
    "model=tiny",
    "task=wos",
    "data.dir=null",
    "logger=none",
    "task.max_new_tokens=6",
    "optim.lr=1e-3",
]


@pytest.fixture(scope="module")
def setup():
    """(config, tokenizer, the tiny model in float32 on CPU, the WoS task on its samples)."""
    cfg = compose_config(CONFIG)
    tokenizer = load_carried_tokenizer(assets_dir())
    model = build_tiny(cfg.model, vocab_size=len(tokenizer)).float().eval()
    return cfg, tokenizer, model, load_task(cfg)


@pytest.fixture(autouse=True)
def exact_cuda_matmuls():
    """No TF32 in the CUDA matrix products: float32 means float32 on both sides."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def on(model: torch.nn.Module, device: str) -> torch.nn.Module:
    return copy.deepcopy(model).to(device)


def chat_prompts(tokenizer) -> list[list[int]]:
    return [encode_prompt(tokenizer, [{"role": "user", "content": m}]) for m in MESSAGES]


def assert_same_generations(expected, actual) -> None:
    """Same tokens and text; per-token log-probabilities within TOKEN_ATOL."""
    assert len(expected) == len(actual)
    for want, got in zip(expected, actual):
        assert got.token_ids == want.token_ids
        assert got.text == want.text and got.finished == want.finished
        for field in ("logp_unconstrained", "logp_constrained", "log_allowed_mass"):
            torch.testing.assert_close(
                torch.tensor(getattr(got, field), dtype=torch.float64),
                torch.tensor(getattr(want, field), dtype=torch.float64),
                atol=TOKEN_ATOL,
                rtol=0,
            )


def decoders(setup, device: str, **kwargs) -> tuple[ConstrainedDecoder, ConstrainedDecoder]:
    """(reference decoder on CPU, the same model's decoder on `device`)."""
    _, tokenizer, model, _ = setup
    return tuple(
        ConstrainedDecoder(m, tokenizer, JSON_GRAMMAR, 12, **kwargs)
        for m in (model, on(model, device))
    )


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_sample_and_beam_match_cpu(setup, device):
    reference, candidate = decoders(setup, device)
    prompts = chat_prompts(setup[1])
    assert_same_generations(reference.greedy(prompts), candidate.greedy(prompts))
    for want, got in zip(
        reference.sample(prompts, 3, generator=torch.Generator().manual_seed(0)),
        candidate.sample(prompts, 3, generator=torch.Generator().manual_seed(0)),
    ):
        assert_same_generations(want, got)
    for want, got in zip(reference.beam(prompts, 3, 1.0), candidate.beam(prompts, 3, 1.0)):
        assert_same_generations([want.top, *want.finished], [got.top, *got.finished])


@pytest.mark.parametrize("device", DEVICES)
def test_cascade_rollout_matches_cpu(setup, device):
    """N samples and the beam top-1 per prompt, the prompt KV kept once (cascade attention:
    the explicit float32 path off CPU, torch's flash kernel on CPU)."""
    reference, candidate = decoders(setup, device, cascade=True)
    assert supports_cascade(candidate.model)
    prompts = chat_prompts(setup[1])
    groups = [
        decoder.rollout(
            prompts, 3, 3, generator=torch.Generator().manual_seed(1), length_penalty=1.0
        )
        for decoder in (reference, candidate)
    ]
    for want, got in zip(*groups):
        assert_same_generations(want, got)


def close_sums(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(
        actual.detach().cpu().double(),
        expected.detach().cpu().double(),
        atol=SUM_ATOL,
        rtol=SUM_RTOL,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_reward_scoring_matches_cpu(setup, device):
    """R_direct, R_reverse and log pi_ref of the gold output and a wrong one, on a WoS prompt."""
    _, tokenizer, model, task = setup
    example = task.splits().train[0]
    prompt = encode_prompt(tokenizer, task.forward_messages(example))
    texts = [example.target, task.splits().train[1].target]
    end = end_of_turn_id(tokenizer)
    candidates = [tokenizer.encode(t, add_special_tokens=False) + [end] for t in texts]
    scores = [
        ReferenceScorer(m, tokenizer, task).score(example, prompt, candidates, texts)
        for m in (model, on(model, device))
    ]
    for field in ("direct", "reverse", "ref_logp"):
        close_sums(getattr(scores[1], field), getattr(scores[0], field))


def one_step(setup, device: str) -> tuple[object, dict[str, torch.Tensor]]:
    """One RL step on `device` (rollout, scoring, loss, backward, AdamW) from the same LoRA
    initialisation and sampling seed: its outputs and the adapter's gradients."""
    cfg, tokenizer, model, task = setup
    torch.manual_seed(0)
    policy = add_lora(copy.deepcopy(model), cfg.lora)
    with torch.no_grad():  # a non-zero adapter (LoRA B starts at zero)
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    settings = StepSettings.from_config(cfg, 1.0, 1.0)
    module = GrammarRLModule(policy.to(device), tokenizer, task, settings)
    module.setup("fit")
    optimizer = module.configure_optimizers()
    step = module.step_loss(task.splits().train[:1])
    step.loss.backward()
    trainable = {n: p for n, p in module.policy.named_parameters() if p.requires_grad}
    grads = {n: p.grad.detach().cpu().clone() for n, p in trainable.items()}
    before = {n: p.detach().clone() for n, p in trainable.items()}
    optimizer.step()
    assert any(not torch.equal(p, before[n]) for n, p in trainable.items())
    return step, grads


@pytest.mark.parametrize("device", DEVICES)
def test_one_rl_step_matches_cpu(setup, device):
    want, want_grads = one_step(setup, "cpu")
    got, got_grads = one_step(setup, device)
    assert len(got.rollouts.groups) == len(want.rollouts.groups) == 1
    for group_want, group_got in zip(want.rollouts.groups, got.rollouts.groups):
        assert_same_generations(group_want, group_got)
    for field in ("rewards", "advantages", "policy_logp", "loss"):
        close_sums(getattr(got, field), getattr(want, field))
    assert want_grads.keys() == got_grads.keys() and want_grads
    assert any(g.abs().sum() > 0 for g in want_grads.values())
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=GRAD_ATOL, rtol=GRAD_RTOL)
