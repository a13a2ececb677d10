"""Output selection and population diagnostics for Sample-Rerank, Full IS and Full SMC (pure
functions over a `ParticleSet`).

An output outside L(G) (cut at the token limit, or dead) has weight zero (`smc`): it adds
nothing to the ESS or to a posterior weight. When every weight of a prompt vanished (all its
outputs truncated, dead or given a zero potential) an output is still chosen, by the rules
below with uniform weights, and the diagnostics count the prompt as vanished.

- Posterior mode (IS, SMC): identical outputs are grouped and their normalised weights summed;
  complete outputs (ended with end-of-turn) are preferred over the rest, then the largest total
  weight wins (with vanished weights: the most frequent output), and remaining ties go to the
  higher LM log-probability log p(y | x).
- Sample-Rerank: among the complete samples the one maximising the potential; ties go to the
  higher proposal weight p(y)/q(y). Without a complete sample it falls back to the posterior mode.
- Diagnostics: the ESS of the final weights, whether every weight vanished (all zero), and the
  posterior-weighted metric (the expected corpus metric when one output per prompt is drawn from
  the particle posterior; complete particles only when there are any, as genlm-control's decoded
  posterior; uniform when their weights vanished).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from grammarrl.decoding.smc import ParticleSet, log_ess
from grammarrl.decoding.types import Generation

NEG_INF = float("-inf")


def normalized_weights(log_weights: Sequence[float]) -> list[float] | None:
    """Self-normalised weights; None when every weight is zero (all vanished)."""
    finite = [w for w in log_weights if w > NEG_INF]  # NaN compares False: dropped too
    if not finite:
        return None
    top = max(finite)
    raw = [math.exp(w - top) if w > NEG_INF else 0.0 for w in log_weights]
    total = sum(raw)
    return [r / total for r in raw]


def ess(log_weights: Sequence[float]) -> float:
    value = log_ess(list(log_weights))
    return math.exp(value) if value > NEG_INF else 0.0


def _key(gen: Generation) -> tuple[str, bool]:
    return gen.text, gen.finished


def posterior_mode(particles: ParticleSet) -> int:
    """Index of a particle carrying the posterior mode (see module docstring)."""
    gens = particles.generations
    weights = normalized_weights(particles.log_weights) or [1.0 / len(gens)] * len(gens)
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, gen in enumerate(gens):
        groups.setdefault(_key(gen), []).append(i)

    def score(members: list[int]) -> tuple:
        gen = gens[members[0]]
        return (gen.finished, sum(weights[i] for i in members), gen.sum_logp_unconstrained)

    best = max(groups.values(), key=score)  # first group wins exact ties (deterministic)
    return best[0]


def rerank(particles: ParticleSet) -> int:
    """Index of the complete sample with the highest potential (ties: higher p/q)."""
    gens = particles.generations
    complete = [i for i, g in enumerate(gens) if g.finished and particles.potentials[i] > NEG_INF]
    if not complete:
        return posterior_mode(particles)
    proposal = particles.proposal_log_weights
    return max(complete, key=lambda i: (particles.potentials[i], proposal[i]))


SELECTORS: dict[str, Callable[[ParticleSet], int]] = {
    "rerank": rerank,
    "is": posterior_mode,
    "smc": posterior_mode,
}


def posterior_draws(
    populations: Sequence[ParticleSet], draws: int, seed: int
) -> list[list[Generation]]:
    """`draws` lists of one output per prompt, each drawn from the prompt's particle posterior
    (complete particles only when there are any; uniform when all weights vanished)."""
    rng = random.Random(seed)
    out: list[list[Generation]] = [[] for _ in range(draws)]
    for particles in populations:
        gens = particles.generations
        idx = [i for i, g in enumerate(gens) if g.finished] or list(range(len(gens)))
        weights = normalized_weights([particles.log_weights[i] for i in idx])
        if weights is None:
            weights = [1.0] * len(idx)
        for d in range(draws):
            out[d].append(gens[rng.choices(idx, weights=weights)[0]])
    return out
