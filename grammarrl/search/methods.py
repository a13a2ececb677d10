"""What a search method is (`SearchMethod`; the methods themselves, one module each, are listed
in `grammarrl.search.registry`), and the particle math they share: normalised weights, ESS,
the posterior mode, posterior draws (pure functions over a `ParticleSet`).

An output outside L(G) (cut at the token limit, or dead) has weight zero (`smc`): it adds
nothing to the ESS or to a posterior weight. When every weight of a prompt vanished (all its
outputs truncated, dead or given a zero potential) an output is still chosen, by the rules
below with uniform weights, and the diagnostics count the prompt as vanished.

- Posterior mode (IS, SMC): identical outputs are grouped and their normalised weights summed;
  complete outputs (ended with end-of-turn) are preferred over the rest, then the largest total
  weight wins (with vanished weights: the most frequent output), and remaining ties go to the
  higher LM log-probability log p(y | x).
- Diagnostics: the ESS of the final weights, whether every weight vanished (all zero), and the
  posterior-weighted metric (the expected corpus metric when one output per prompt is drawn from
  the particle posterior; complete particles only when there are any, as genlm-control's decoded
  posterior; uniform when their weights vanished).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grammarrl.decoding.smc import ParticleSet, log_ess
from grammarrl.decoding.types import Generation

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SearchMethod:
    """One search method, selected by `search.method=<name>`. Every method draws its particles
    with `grammarrl.decoding.smc.smc`; a method says

    - `select`: which particle's output it keeps (an index into one prompt's `ParticleSet`);
    - `potential`: the potential it pairs with when `search.potential` is null;
    - `resamples`: whether it resamples when ESS < `search.ess_threshold` · N (SMC) or never (IS);
    - `selections`: the methods whose picks a run reports on its particles, in order, its own
      among them (rerank and is draw the same particles, so each reports both); (): its own.
    """

    name: str
    select: Callable[[ParticleSet], int]
    potential: str
    resamples: bool = False
    selections: tuple[str, ...] = ()

    def reported(self) -> tuple[str, ...]:
        """The methods whose picks a run of this method reports, its own among them."""
        return self.selections or (self.name,)


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
