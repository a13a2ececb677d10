"""Sample-Rerank: the IS particles (no resampling); the output is the complete sample with the
highest potential, ties going to the higher proposal weight p(y)/q(y); without a complete
sample, the posterior mode. Paired with the reverse potential."""

from __future__ import annotations

from grammarrl.decoding.smc import ParticleSet
from grammarrl.search.methods import NEG_INF, SearchMethod, posterior_mode


def rerank(particles: ParticleSet) -> int:
    """Index of the complete sample with the highest potential (ties: higher p/q)."""
    gens = particles.generations
    complete = [i for i, g in enumerate(gens) if g.finished and particles.potentials[i] > NEG_INF]
    if not complete:
        return posterior_mode(particles)
    proposal = particles.proposal_log_weights
    return max(complete, key=lambda i: (particles.potentials[i], proposal[i]))


METHOD = SearchMethod("rerank", rerank, potential="reverse", selections=("rerank", "is"))
