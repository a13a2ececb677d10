"""Sequential Monte Carlo (and importance sampling) over the grammar-constrained decoder.

Per prompt, N particles are extended one token at a time from the locally masked proposal
q(y_t | x, y_<t) = softmax(logits / T) restricted to the tokens the grammar allows, as
`ConstrainedDecoder.sample` does (same prefill, same shared KV cache, same uniforms from the same
generator: with resampling off and T = 1 the particles ARE `decoder.sample`'s samples). The
log weight of a particle accumulates

    log p(y_t | x, y_<t) - log q(y_t | x, y_<t)       (= log allowed mass at T = 1)

so that after the last step w(y) = p(y | x) / q(y | x): properly weighted for the target
p(y | x) 1[y in L(G)] (Loula et al. 2025; exact, where the paper's AWRS estimates the mass by
rejection). A `Twist` (an "expensive potential" Phi) multiplies the target: on every step the
weight gains log Phi(prefix') - log Phi(prefix), and on completion log Phi(y) - log Phi(prefix),
so the final weight is p(y)/q(y) * Phi(y) (telescoping) whatever the schedule.

A particle that ends outside L(G) has weight zero (log weight and recorded potential -inf): one
the grammar stops (a dead end or a refused token) and one cut at `max_new_tokens` (truncated: no
end-of-turn, so not in the language whatever its completion potential would be). Resampling
never copies such a particle, and the ESS and normalised weights ignore it; when every particle
of a prompt ends so, its weights vanish (`log_ess` -inf).

When the effective sample size 1 / sum(w_norm^2) of a prompt's population falls below
`ess_threshold * N` the population is resampled (multinomial, from its own generator): finished
particles are copied as records, live ones are forked (matchers `deep_copy`, the rows'
generated KV duplicated), and every weight is set to the population's mean weight (log-sum-exp minus log N).
Finished particles stay in the population with fixed weights, as in genlm-control.
`ess_threshold = 0` never resamples: importance sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from grammarrl.decoding.decoder import ConstrainedDecoder
from grammarrl.decoding.rows import (
    FINISHED,
    LIVE,
    NEG_INF,
    SAMPLE,
    TRUNCATED,
    Choice,
    Row,
    normalise_prompts,
    sample_tokens,
)
from grammarrl.decoding.types import Generation


class Twist(Protocol):
    """An expensive potential Phi for the particle loop (log values; -inf kills a particle).

    `on_prefix`: evaluate `prefix` after every token (SMC twisting); False: only `complete`.
    `prefix(prompt, text)` judges a partial output (also used for outputs cut at the token
    limit); `complete(prompt, texts)` judges finished outputs of one prompt, in one batch.
    `prompt` is the prompt's index in the call.
    """

    on_prefix: bool

    def prefix(self, prompt: int, text: str) -> float: ...

    def complete(self, prompt: int, texts: list[str]) -> list[float]: ...


@dataclass
class ParticleSet:
    """The final population of one prompt.

    `log_weights[i]` = log p(y_i)/q(y_i) + log Phi(y_i) (+ the constant of any resampling);
    `potentials[i]` = the log Phi included in it (complete outputs: `complete`; 0 without a
    twist; -inf for an output outside L(G): dead or truncated, whose log weight is -inf too).
    `proposal_log_weights[i]` = log_weights - potentials: the local-masking correction alone
    (equal to the sum of log allowed mass when no resampling happened; -inf outside L(G)).
    Resampled copies share their Generation object.
    """

    generations: list[Generation]
    log_weights: list[float]
    potentials: list[float]
    resamples: int = 0
    ess_trace: list[float] = field(default_factory=list)  # ESS after each step's reweighting

    @property
    def proposal_log_weights(self) -> list[float]:
        return [w - p if math.isfinite(p) else w for w, p in zip(self.log_weights, self.potentials)]


class _Particle:
    __slots__ = ("done", "gen", "logw", "row", "twist")

    def __init__(self, row: Row | None, logw: float = 0.0, twist: float = 0.0):
        self.row = row
        self.logw = logw
        self.twist = twist  # the log Phi currently included in logw
        self.gen: Generation | None = None
        self.done = False


def log_ess(log_weights: list[float]) -> float:
    """log of the effective sample size 1 / sum(w_norm^2); -inf when every weight is zero."""
    finite = [w for w in log_weights if w != NEG_INF]
    if not finite:
        return NEG_INF
    w = torch.tensor(finite, dtype=torch.float64)
    return float(2 * torch.logsumexp(w, 0) - torch.logsumexp(2 * w, 0))


def smc(
    decoder: ConstrainedDecoder,
    prompts: list[list[int]],
    num_particles: int,
    twist: Twist | None = None,
    ess_threshold: float = 1 / 3,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    resample_generator: torch.Generator | None = None,
) -> list[ParticleSet]:
    """Run SMC (IS when `ess_threshold` is 0) with `num_particles` particles per prompt."""
    if num_particles < 1:
        raise ValueError(f"num_particles must be >= 1, got {num_particles}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 <= ess_threshold <= 1.0:
        raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold}")
    prompts = normalise_prompts(prompts)
    if not prompts:
        return []
    with decoder.inference():
        return _Loop(
            decoder,
            prompts,
            num_particles,
            twist,
            ess_threshold,
            temperature,
            generator,
            resample_generator,
        ).run()


class _Loop:
    def __init__(
        self, decoder, prompts, n, twist, ess_threshold, temperature, generator, resample_generator
    ):
        self.decoder = decoder
        self.prompts = prompts
        self.n = n
        self.twist = twist
        self.threshold = ess_threshold
        self.temperature = float(temperature)
        self.generator = generator
        self.resample_generator = resample_generator
        self.on_prefix = bool(twist is not None and twist.on_prefix)
        # Without resampling no weight steers anything: completion potentials are scored at
        # the end, one batch per prompt (same values, fewer model calls for a reverse score).
        self.defer = twist is not None and ess_threshold == 0
        self.resamples = [0] * len(prompts)
        self.ess_trace: list[list[float]] = [[] for _ in prompts]

    def run(self) -> list[ParticleSet]:
        """Extend every live particle by one sampled token per step; reweight, resample where
        the ESS is too low, and continue the survivors' cache rows."""
        dec = self.decoder
        self.population: list[list[_Particle]] = [
            [
                _Particle(Row(p, SAMPLE, j, dec.grammar.matcher(), len(prompt)))
                for j in range(self.n)
            ]
            for p, prompt in enumerate(self.prompts)
        ]
        live = [pt for group in self.population for pt in group]
        logits, kv = dec.start(self.prompts, self.n)
        while live:
            completed = self._extend(
                live, dec.distribution(logits, [pt.row.matcher for pt in live])
            )
            if self.twist is not None and not self.defer:
                for p, done in completed.items():
                    self._retwist_all(done, self.twist.complete(p, [pt.gen.text for pt in done]))
            new_live, new_src = self._next_population(live)
            if not new_live:
                break
            logits = dec.advance(kv, [pt.row for pt in live], [pt.row for pt in new_live], new_src)
            live = new_live
        if self.defer:
            for p, group in enumerate(self.population):
                done = [pt for pt in group if pt.gen.finished and pt.logw != NEG_INF]
                if done:
                    self._retwist_all(done, self.twist.complete(p, [pt.gen.text for pt in done]))
        return [
            ParticleSet(
                generations=[pt.gen for pt in group],
                log_weights=[pt.logw for pt in group],
                potentials=[pt.twist for pt in group],
                resamples=self.resamples[p],
                ess_trace=self.ess_trace[p],
            )
            for p, group in enumerate(self.population)
        ]

    def _extend(self, live: list[_Particle], dist) -> dict[int, list[_Particle]]:
        """Each live particle draws its token from the proposal and takes it; its weight gains
        log p/q (and the prefix twist's change). Returns the particles completed, by prompt."""
        dec = self.decoder
        sub, log_norm = dist.proposal(self.temperature)  # [R, V], [R]
        tok = sample_tokens(sub, log_norm, self.generator)  # [R]
        rows = torch.arange(len(live), device=dec.device)
        lq = sub[rows, tok] - log_norm  # [R] log q(token): the proposal's own probability
        columns = [tok, *dist.token_logps(rows, tok), lq]
        table = torch.stack([c.double() for c in columns], dim=1).tolist()  # one host sync
        completed: dict[int, list[_Particle]] = {}
        for i, (pt, (t, logp_u, logp_c, mass, logq)) in enumerate(zip(live, table)):
            outcome, error = dec.take(pt.row, Choice(i, int(t), logp_u, logp_c, mass))
            # p/q of this token; at T = 1 exactly the recorded allowed mass.
            pt.logw += mass if self.temperature == 1.0 else logp_u - logq
            if outcome != LIVE:
                self._finish(pt, outcome, error)
                if outcome == FINISHED:
                    completed.setdefault(pt.row.prompt, []).append(pt)
            elif self.on_prefix:
                self._retwist(
                    pt, self.twist.prefix(pt.row.prompt, dec.grammar.decode(pt.row.tokens))
                )
        return completed

    def _next_population(self, live: list[_Particle]) -> tuple[list[_Particle], list[int]]:
        """Record each prompt's ESS and resample where it is too low; the live particles with
        the cache row each continues (resampled copies fork their parent's row)."""
        position = {id(pt): i for i, pt in enumerate(live)}
        new_live: list[_Particle] = []
        new_src: list[int] = []
        for p, group in enumerate(self.population):
            if all(pt.done for pt in group):
                continue
            log_e = log_ess([pt.logw for pt in group])
            self.ess_trace[p].append(math.exp(log_e) if log_e > NEG_INF else 0.0)
            sources = {id(pt): position.get(id(pt)) for pt in group}
            if self.threshold > 0 and NEG_INF < log_e < math.log(self.threshold * self.n):
                group, sources = self._resample(p, group, position)
            for pt in group:
                if not pt.done:
                    new_live.append(pt)
                    new_src.append(sources[id(pt)])
        return new_live, new_src

    def _retwist_all(self, particles: list[_Particle], values: list[float]) -> None:
        for pt, value in zip(particles, values):
            self._retwist(pt, value)

    def _retwist(self, pt: _Particle, value: float) -> None:
        if pt.logw != NEG_INF:
            pt.logw = pt.logw + value - pt.twist if value != NEG_INF else NEG_INF
        pt.twist = value

    def _finish(self, pt: _Particle, outcome: str, error: str | None) -> None:
        """Record the particle's output; one not ended by end-of-turn (dead, refused or cut at
        the token limit) is outside L(G): weight and potential zero."""
        pt.gen = self.decoder.generation(pt.row, outcome == FINISHED, outcome == TRUNCATED, error)
        pt.done = True
        if outcome != FINISHED:
            pt.logw = pt.twist = NEG_INF

    def _resample(self, p: int, group: list[_Particle], position: dict[int, int]):
        """Multinomial resampling of prompt p's population: installs the new population and
        returns it with, per live particle id, the cache row it continues."""
        n = self.n
        logw = torch.tensor([pt.logw for pt in group], dtype=torch.float64)
        total = torch.logsumexp(logw, 0)
        probs = torch.exp(logw - total)
        draws = torch.multinomial(probs, n, replacement=True, generator=self.resample_generator)
        mean = float(total - math.log(n))
        ancestors = sorted(int(a) for a in draws.tolist())
        uses: dict[int, int] = {}
        for a in ancestors:
            uses[a] = uses.get(a, 0) + 1
        new_group, sources = [], {}
        for a in ancestors:
            parent = group[a]
            uses[a] -= 1
            if parent.done:
                child = _Particle(None, mean, parent.twist)
                child.gen, child.done = parent.gen, True
            else:
                # every copy but the last of a parent gets a forked matcher
                matcher = parent.row.matcher if uses[a] == 0 else parent.row.matcher.deep_copy()
                child = _Particle(parent.row.child(matcher), mean, parent.twist)
                sources[id(child)] = position[id(parent)]
            new_group.append(child)
        self.population[p] = new_group
        self.resamples[p] += 1
        return new_group, sources
