"""What the constrained decoder returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Generation:
    """One generated output with per-token log-probabilities.

    For every generated token t (the final end-of-turn token included when the row finished):

    - `logp_unconstrained[t]` = log pi(y_t | x, y_<t): full-vocabulary log-softmax of the model's
      raw logits at temperature 1 (what rewards and the RL loss use);
    - `logp_constrained[t]`   = log pi^G(y_t | x, y_<t): log-softmax renormalised over the tokens
      the grammar allows (temperature 1);
    - `log_allowed_mass[t]`   = log of the total unconstrained probability of the allowed tokens,
      so that logp_constrained = logp_unconstrained - log_allowed_mass (importance weights).
    """

    token_ids: list[int]
    """The generated tokens (the end-of-turn token last when the output finished)."""
    text: str
    """The decoded output, without the end-of-turn token."""
    logp_unconstrained: list[float]
    logp_constrained: list[float]
    log_allowed_mass: list[float]
    finished: bool
    """The output ended with the end-of-turn token, which the grammar allows only where it
    accepts."""
    truncated: bool
    """The output reached `max_new_tokens` before the grammar was complete."""
    kind: str
    """How it was decoded: "greedy", "sample" or "beam"."""
    error: str | None = field(default=None, compare=False)
    """Why decoding stopped early (a dead end of the grammar), else None."""

    @property
    def sum_logp_unconstrained(self) -> float:
        return float(sum(self.logp_unconstrained))

    @property
    def sum_logp_constrained(self) -> float:
        return float(sum(self.logp_constrained))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class BeamResult:
    """Constrained beam search for one prompt: the best hypothesis and every finished beam.

    `top` is the highest-scoring finished hypothesis (score = sum of constrained log-probs /
    length**length_penalty, end token included in the length), or the best truncated beam when
    none finished. `finished` holds all hypotheses that ended with the end-of-turn token during
    the search, best first by that score.
    """

    top: Generation
    finished: list[Generation]
