"""Amortised importance sampling (`train.objective=amortised_is`): the pure parts.

Per prompt the current policy's grammar-constrained sampler q_θ draws `search.particles`
particles with Full IS (`grammarrl.decoding.smc` with no resampling, the potential
`search.potential` scored on complete outputs, as mode=search search.method=is does). Its log
weights are log p_θ(y)/q_θ(y) + log Φ(y): towards p_θ·Φ. Training moves p_θ, so amortising
towards p_θ·Φ would sharpen the target every step (p_θ^(k+1) ∝ p_θ^k·Φ, i.e. Φ^k); the target
here is the paper's fixed one, p_ref(y)·1[y ∈ L(G)]·Φ(y), which Full IS with the frozen proposal
approximates:

    log w(y) = log_weight_IS(y) − log p_θ(y | x) + log p_ref(y | x)

(equal to mode=search's weights while the adapter is zero, the policy being the reference).
As `posterior_draws`, only complete particles are candidates when there are any; a prompt
whose candidates' weights all vanished gives no targets. `rollout.num_samples` targets are
drawn by multinomial resampling of the self-normalised weights, from the training generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grammarrl.decoding.smc import ParticleSet
from grammarrl.decoding.types import Generation
from grammarrl.search.methods import NEG_INF, normalized_weights


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
