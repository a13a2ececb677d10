"""The rows of the decoder's batch and the token-level pieces every decoding rule shares: the
masked next-token distribution of a step, inverse-CDF sampling, what a row does after a token.
`ConstrainedDecoder` (greedy, sample, beam) and SMC (`smc.py`) both build on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

GREEDY, SAMPLE, BEAM = 0, 1, 2
KIND_NAMES = {GREEDY: "greedy", SAMPLE: "sample", BEAM: "beam"}
NEG_INF = float("-inf")
# What a row does after a token (`ConstrainedDecoder.take`)
LIVE, FINISHED, TRUNCATED, DEAD, ERROR = "live", "finished", "truncated", "dead", "error"


class Choice(NamedTuple):
    """One chosen next token of one row: a line of a step's host-side table."""

    row: int  # the row's index in the step's batch (its KV cache slot)
    token: int
    logp_unconstrained: float  # log-softmax of the raw logits
    logp_constrained: float  # renormalised over the allowed tokens
    log_allowed_mass: float  # log of the allowed tokens' mass (-inf: a dead end)
    score: float = NEG_INF  # a beam extension's summed constrained log-prob

    @classmethod
    def of(cls, line: list[float]) -> Choice:
        """From a table line [row, token, logp_u, logp_c, mass(, score)] of floats."""
        return cls(int(line[0]), int(line[1]), *line[2:])


class Row:
    """A live row: one partial output with its matcher and its place in the KV cache."""

    __slots__ = (
        "index",
        "kind",
        "log_allowed_mass",
        "logp_constrained",
        "logp_unconstrained",
        "matcher",
        "plen",
        "prompt",
        "score",
        "tokens",
    )

    def __init__(self, prompt: int, kind: int, index: int, matcher: Any, plen: int):
        self.prompt = prompt
        self.kind = kind
        self.index = index  # sample number within the prompt
        self.matcher = matcher
        self.tokens: list[int] = []
        self.logp_unconstrained: list[float] = []
        self.logp_constrained: list[float] = []
        self.log_allowed_mass: list[float] = []
        self.score = 0.0  # sum of constrained log-probs (the beam score)
        self.plen = plen  # prompt length: position id of the first generated token

    def child(self, matcher: Any) -> Row:
        row = Row(self.prompt, self.kind, self.index, matcher, self.plen)
        row.tokens = list(self.tokens)
        row.logp_unconstrained = list(self.logp_unconstrained)
        row.logp_constrained = list(self.logp_constrained)
        row.log_allowed_mass = list(self.log_allowed_mass)
        row.score = self.score
        return row

    def push(self, choice: Choice) -> None:
        """Append the chosen token and its log-probs."""
        self.tokens.append(choice.token)
        self.logp_unconstrained.append(choice.logp_unconstrained)
        self.logp_constrained.append(choice.logp_constrained)
        self.log_allowed_mass.append(choice.log_allowed_mass)
        self.score += choice.logp_constrained


@dataclass
class StepDistribution:
    """The next-token distributions of one step's rows (R rows, vocabulary V) under their
    grammar masks."""

    logits: torch.Tensor  # [R, V] raw model logits
    masked: torch.Tensor  # [R, V] the logits, disallowed tokens at -inf
    lse_all: torch.Tensor  # [R] log of the full softmax normaliser
    lse_allowed: torch.Tensor  # [R] log of the allowed mass's normaliser (-inf: a dead row)
    lse_safe: torch.Tensor  # [R] lse_allowed with 0 for dead rows (no NaNs downstream)

    @classmethod
    def of(cls, logits: torch.Tensor, allowed: torch.Tensor) -> StepDistribution:
        masked = torch.where(allowed, logits, NEG_INF)
        lse_allowed = torch.logsumexp(masked, dim=-1)
        return cls(
            logits,
            masked,
            torch.logsumexp(logits, dim=-1),
            lse_allowed,
            torch.where(lse_allowed.isfinite(), lse_allowed, 0.0),
        )

    def proposal(
        self, temperature: float, index: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampling distribution of the rows `index` (all: None) at `temperature`: masked
        logits [r, V] / T and their log normaliser [r] (0 for dead rows)."""
        sub = self.masked if index is None else self.masked.index_select(0, index)
        if temperature == 1.0:
            return sub, self.lse_safe if index is None else self.lse_safe.index_select(0, index)
        sub = sub / temperature
        log_norm = torch.logsumexp(sub, dim=-1)
        return sub, torch.where(log_norm.isfinite(), log_norm, 0.0)

    def token_logps(
        self, rows: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per chosen (row, token) [K]: unconstrained and constrained log-probs, log allowed mass."""
        chosen = self.logits[rows, tokens]
        lse_all, lse_allowed = self.lse_all[rows], self.lse_allowed[rows]
        return chosen - lse_all, chosen - lse_allowed, lse_allowed - lse_all


def normalise_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """Prompts as lists of ints; an empty prompt is an error."""
    prompts = [list(map(int, p)) for p in prompts]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt")
    return prompts


def dead_end_reason(row: Row) -> str:
    """A one-line reason for a dead end (llguidance's message can span a state dump)."""
    matcher = row.matcher
    err = matcher.get_error().splitlines()[0] if matcher is not None and matcher.is_error() else ""
    return err or f"the grammar allows no continuation after {len(row.tokens)} tokens (dead end)"


def sample_tokens(
    logits: torch.Tensor, log_norm: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row from exp(logits - log_norm) (disallowed tokens at -inf: probability 0),
    by inverse CDF with one uniform per row drawn from `generator` on its own device, then
    moved: reproducible on CPU and CUDA alike. The CDF is accumulated in float64; a zero-
    probability token can never be drawn (its CDF step is empty)."""
    cdf = torch.exp(logits - log_norm.unsqueeze(1)).double().cumsum(dim=-1)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand(logits.shape[0], generator=generator, dtype=torch.float64, device=gen_device)
    total = cdf[:, -1]
    target = torch.minimum(u.to(logits.device) * total, torch.nextafter(total, total.new_zeros(())))
    tok = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    return tok.clamp_max(logits.shape[1] - 1)  # rows with no allowed token: caller drops them
