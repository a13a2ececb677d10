"""Amortised importance sampling (`train.objective=amortised_is`): one step up to its loss,
and what it logs.

Per prompt the current policy's grammar-constrained sampler q_θ draws `search.particles`
particles with Full IS (`grammarrl.decoding.smc` with no resampling, the potential
`search.potential` scored on complete outputs, as mode=search search.method=is does). Its log
weights are log p_θ(y)/q_θ(y) + log Φ(y): towards p_θ·Φ. (With `train.proposal=reference`
the frozen model draws them instead, its adapter disabled: p_θ is then p_ref, the weights are
Full IS's with the frozen proposal, and the targets a fixed distribution the policy is
distilled towards.) Training moves p_θ, so amortising towards p_θ·Φ would sharpen the target every step (p_θ^(k+1) ∝ p_θ^k·Φ, i.e. Φ^k); the target
here is the paper's fixed one, p_ref(y)·1[y ∈ L(G)]·Φ(y), which Full IS with the frozen proposal
approximates:

    log w(y) = log_weight_IS(y) − log p_θ(y | x) + log p_ref(y | x)

(equal to mode=search's weights while the adapter is zero, the policy being the reference).
As `posterior_draws`, only complete particles are candidates when there are any; a prompt
whose candidates' weights all vanished gives no targets. `rollout.num_samples` targets are
drawn by multinomial resampling of the self-normalised weights, from the training generator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grammarrl.decoding.smc import ParticleSet, smc
from grammarrl.decoding.types import Generation
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import reference_mode
from grammarrl.rl.reward import Reward
from grammarrl.rl.rewards import CandidateScores
from grammarrl.rl.rloo import grammarrl_loss
from grammarrl.runs.timing import clock
from grammarrl.search.methods import NEG_INF, ess, normalized_weights
from grammarrl.search.potentials import Potential
from grammarrl.training.policy import (
    StepModels,
    policy_logp,
    policy_train_mode,
    summed_per_candidate,
)
from grammarrl.training.settings import StepSettings
from grammarrl.types import Example


def target_log_weights(
    is_log_weights: Sequence[float],
    generations: Sequence[Generation],
    ref_logp: Sequence[float],
) -> list[float]:
    """log p_ref(y)·Φ(y)/q_θ(y) per particle from its IS weight log p_θ(y)·Φ(y)/q_θ(y) and the
    reference's log p_ref(y | x) (`ref_logp`; ignored where the weight is -inf)."""
    return [
        w - gen.sum_logp_unconstrained + ref if w > NEG_INF else NEG_INF
        for w, gen, ref in zip(is_log_weights, generations, ref_logp)
    ]


def candidate_indices(particles: ParticleSet) -> list[int]:
    """The particles targets are drawn from: the complete ones with a finite IS weight when
    there are any (an output cut at the token limit carries no completion potential), else none."""
    return [
        i
        for i, (gen, w) in enumerate(zip(particles.generations, particles.log_weights))
        if gen.finished and w > NEG_INF
    ]


def resample(log_weights: Sequence[float], count: int, generator: torch.Generator) -> list[int]:
    """`count` indices drawn with replacement in proportion to the self-normalised weights
    (multinomial), sorted; [] when every weight vanished."""
    weights = normalized_weights(log_weights)
    if weights is None:
        return []
    probs = torch.tensor(weights, dtype=torch.float64)
    return sorted(torch.multinomial(probs, count, replacement=True, generator=generator).tolist())


@dataclass
class AmortisedStep:
    """What one amortised-IS step computed before backward (`train.objective=amortised_is`).
    Per prompt: its particles, the target log weights of its candidates (`candidate_indices`),
    and the resampled targets (indices into the particles; none when every weight vanished).
    The tensors cover the prompts with targets only: [prompts with targets, rollout.num_samples]."""

    examples: list[Example]
    populations: list[ParticleSet]
    log_weights: list[list[float]]
    targets: list[list[int]]
    policy_logp: torch.Tensor  # log pi_theta(y|x) of the targets, with gradient
    ref_logp: torch.Tensor  # log pi_ref(y|x) of the targets
    direct: torch.Tensor  # the reward's direct term of the targets
    reverse: torch.Tensor | None  # its reverse term (search.potential=reverse only)
    loss: torch.Tensor
    parts: dict[str, torch.Tensor]
    seconds: dict[str, float]

    @property
    def groups(self) -> list[list[Generation]]:
        """The target outputs of each prompt with targets."""
        return [
            [pop.generations[i] for i in picks]
            for pop, picks in zip(self.populations, self.targets)
            if picks
        ]


@dataclass
class Targets:
    """The resampled targets of a batch's particles, with the reward's terms of them and
    log pi_ref(y | x) (`scores`: one per prompt with targets; the reverse pass is the potential's
    per token of x, search.potential=reverse)."""

    log_weights: list[list[float]]
    indices: list[list[int]]  # per prompt, into its particles
    scores: list[CandidateScores]

    def stacked(self, name: str) -> torch.Tensor:
        """One field of the scores, a row per prompt with targets."""
        return torch.stack([getattr(scores, name) for scores in self.scores])


def draw_targets(
    batch: list[Example],
    prompts: list[list[int]],
    populations: list[ParticleSet],
    reward: Reward,
    count: int,
    generator: torch.Generator,
) -> Targets:
    """Per prompt: its candidates' target log weights (`target_log_weights`, under the reference's
    log p_ref), `count` targets resampled from them, and the targets' scores under `reward`."""
    targets = Targets([], [], [])
    scorer = reward.scorer
    for ex, prompt, pop in zip(batch, prompts, populations):
        idx = candidate_indices(pop)
        gens = [pop.generations[i] for i in idx]
        ref = scorer.forward_logprobs(prompt, [g.token_ids for g in gens]) if idx else []
        sums = [float(lp.sum()) for lp in ref]
        logw = target_log_weights([pop.log_weights[i] for i in idx], gens, sums)
        picks = resample(logw, count, generator)
        targets.log_weights.append(logw)
        targets.indices.append([idx[j] for j in picks])
        if picks:
            x_tokens = len(scorer.input_ids(ex))
            measured = CandidateScores(
                direct=torch.stack([ref[j].mean() for j in picks]),
                reverse=torch.tensor([pop.potentials[idx[j]] / x_tokens for j in picks]),
                ref_logp=torch.stack([ref[j].sum() for j in picks]),
                lengths=torch.tensor([gens[j].num_tokens for j in picks]),
            )
            texts = [gens[j].text for j in picks]
            targets.scores.append(reward.terms(ex, texts, measured))
    return targets


def amortised_step_loss(
    batch: list[Example],
    models: StepModels,
    potential: Potential,
    settings: StepSettings,
    generator: torch.Generator,
) -> AmortisedStep:
    """One amortised-IS step up to the loss: Full IS particles of the current policy (or of the
    frozen model, `train.proposal=reference`), weighted towards p_ref·Φ, `rollout.num_samples`
    targets resampled per prompt (`draw_targets`), and the loss mean −log pi_theta(y|x) over
    the targets (+ β·KL to pi_ref with `kl_penalty=loss`; the other placements have no reward
    to shape: no KL term)."""
    search, count = settings.amortised, settings.rollout.num_samples
    policy = models.policy
    policy.eval()
    started = clock()
    prompts = [encode_prompt(models.tokenizer, models.task.forward_messages(ex)) for ex in batch]
    twist = potential.bind(list(batch)) if potential.name != "none" else None
    proposal = (
        reference_mode(policy) if search.proposal == "reference" else contextlib.nullcontext()
    )
    with proposal:
        populations = smc(
            models.decoder,
            prompts,
            search.particles,
            twist=twist,
            ess_threshold=0.0,
            temperature=search.temperature,
            generator=generator,
        )
    rolled_out = clock()
    drawn = draw_targets(batch, prompts, populations, models.reward, count, generator)
    seconds = {"rollout": rolled_out - started, "scoring": clock() - rolled_out}
    kept = [(p, pop, t) for p, pop, t in zip(prompts, populations, drawn.indices) if t]
    policy_train_mode(policy, dropout=settings.policy_dropout)
    started = clock()
    groups = [[pop.generations[i] for i in t] for _, pop, t in kept]
    logp = (
        policy_logp(policy, [p for p, _, _ in kept], groups, settings.share_prefix)
        if kept
        else torch.zeros(0, count)
    )
    seconds["policy"] = clock() - started
    ref_logp = drawn.stacked("ref_logp").to(logp.device) if kept else logp.detach()
    beta = settings.beta if settings.kl_penalty == "loss" else 0.0
    loss, parts = grammarrl_loss(logp, ref_logp, torch.ones_like(logp), beta)
    return AmortisedStep(
        examples=list(batch),
        populations=populations,
        log_weights=drawn.log_weights,
        targets=drawn.indices,
        policy_logp=logp,
        ref_logp=ref_logp,
        direct=drawn.stacked("direct") if kept else torch.zeros(0, count),
        reverse=drawn.stacked("reverse") if kept and potential.name == "reverse" else None,
        loss=loss,
        parts=parts,
        seconds=seconds,
    )


def amortised_metrics(step: AmortisedStep, settings: StepSettings) -> dict[str, torch.Tensor]:
    """Per step: the loss, its NLL and KL parts, the ESS of the target weights, the share of
    prompts without targets, the particles' validity, and of the targets what RLOO logs
    of its candidates (rewards under pi_ref, length, distinct outputs, grammar mass)."""
    particles = [g for pop in step.populations for g in pop.generations]
    metrics = {
        "train/loss": step.loss.detach(),
        "train/nll": step.parts["loss/pg"],
        "train/kl": step.parts["kl"],
        "train/ess": torch.tensor([ess(w) if w else 0.0 for w in step.log_weights]).mean(),
        "train/no_targets": torch.tensor([not t for t in step.targets]).float().mean(),
        "train/validity": torch.tensor([g.finished for g in particles]).float().mean(),
        "train/truncated": torch.tensor([g.truncated for g in particles]).float().mean(),
    }
    groups = step.groups
    if not groups:
        return metrics
    targets = [g for group in groups for g in group]
    constrained = summed_per_candidate(groups, "logp_constrained").to(step.direct.device)
    metrics.update(
        {
            "train/reward_direct": step.direct.mean(),
            "train/candidate_tokens": torch.tensor(
                [len(g.token_ids) for g in targets], dtype=torch.float
            ).mean(),
            "train/distinct_targets": torch.tensor(
                [len({tuple(g.token_ids) for g in group}) / len(group) for group in groups]
            ).mean(),
            "train/log_valid_mass": summed_per_candidate(groups, "log_allowed_mass").mean(),
            "train/kl_grammar": (constrained - step.ref_logp.detach().cpu()).mean(),
        }
    )
    if step.reverse is not None:
        rewards = settings.mixing.combine(step.direct, step.reverse)
        metrics.update(
            {"train/reward": rewards.mean(), "train/reward_reverse": step.reverse.mean()}
        )
    return metrics


def amortised_sample(step: AmortisedStep, global_step: int) -> dict[str, Any]:
    """The step's sample row (samples.jsonl): its first input and that input's targets."""
    return {
        "step": global_step,
        "input": step.examples[0].input,
        "candidates": [step.populations[0].generations[i].text for i in step.targets[0]],
    }
