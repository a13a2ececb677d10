"""The frozen reference model's two passes over a candidate, without the grammar mask: what every
reward (`grammarrl.rl.reward`) is computed from.

The direct pass:  R_direct(x, y)  = mean over the tokens of y (end-of-turn included) of
                  log pi_ref(y_t | x, y_<t); it also gives log pi_ref(y | x) (the sum), the KL term.
The reverse pass: R_reverse(x, y) = mean over the tokens of x of log pi_ref(x_k | tau(y), x_<k).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from grammarrl.decoding.scoring import (
    Prefix,
    common_prefix_length,
    encode_prefix,
    positions_run,
    sequence_logprobs,
)
from grammarrl.models.chat import encode_prompt
from grammarrl.models.loading import reference_mode
from grammarrl.tasks.base import Task
from grammarrl.types import Example

DIRECT, REVERSE = "direct", "reverse"  # the reference passes
PASSES = (DIRECT, REVERSE)


@dataclass
class CandidateScores:
    """Scores of the candidates of one input (one entry per candidate): what the reference passes
    measured (None for a pass not run), or, after `Reward.terms`, a reward's two terms."""

    direct: torch.Tensor | None  # R_direct, mean log-prob per token of y (or the direct term)
    reverse: torch.Tensor | None  # R_reverse, mean log-prob per token of x (or the reverse term)
    ref_logp: torch.Tensor | None  # log pi_ref(y | x), summed over the tokens of y
    lengths: torch.Tensor  # tokens of y, end-of-turn included (what R_direct averages over)


class ReferenceScorer:
    """Scores candidates with pi_ref (the policy with its adapter disabled)."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, task: Task, share_prefix: bool = True
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.share_prefix = share_prefix
        self._reverse_prefix: Prefix | None = None
        self._forward_prefix: Prefix | None = None
        self._first_prompt: list[int] | None = None

    @torch.no_grad()
    def reverse_static_prefix(self) -> Prefix:
        """The reverse prompt's static part (inverse instruction, swapped demonstrations), run
        once per scorer under pi_ref: it never changes, since the reference is frozen."""
        if self._reverse_prefix is None:
            probes = [encode_prompt(self.tokenizer, self.task.reverse_messages(c)) for c in "AZ"]
            tokens = probes[0][: common_prefix_length(probes)]
            with reference_mode(self.model):
                self._reverse_prefix = encode_prefix(self.model, tokens)
        return self._reverse_prefix

    @torch.no_grad()
    def forward_static_prefix(self, prompt: list[int]) -> Prefix | None:
        """The part every forward prompt scored so far shares (the instruction; with a static
        context such as WoS's label hierarchy, the whole system prompt and demonstrations), run
        once under pi_ref; None before a second, different prompt is seen (or without
        `share_prefix`). A prompt that shares less shortens it: it is run again, shorter."""
        if not self.share_prefix:
            return None
        cached = self._forward_prefix
        known = cached.tokens if cached is not None else self._first_prompt
        if known is None or (cached is None and prompt == known):
            self._first_prompt = list(prompt)
            return None  # no other prompt seen yet
        shared = common_prefix_length([known, prompt])
        if shared == 0:
            return None
        if cached is None or shared < len(cached.tokens):
            with reference_mode(self.model):
                self._forward_prefix = encode_prefix(self.model, prompt[:shared])
        return self._forward_prefix

    def input_ids(self, example: Example) -> list[int]:
        """Token ids of x as the assistant turn of the reverse prompt (no end token)."""
        return self.tokenizer.encode(example.input, add_special_tokens=False)

    @torch.no_grad()
    def reverse_logprobs(
        self, example: Example, candidate_texts: list[str]
    ) -> tuple[list[torch.Tensor], int]:
        """Per-token log pi_ref(x_k | tau(y), x_<k) of x after each candidate y's reverse prompt,
        and the token positions run for them (the sequences after the cached static prefix).

        The static prefix is tokenized from stand-in outputs: a candidate whose first characters
        merge with the template's last token (leading spaces, a blank line) does not start with
        its tokens, and its row is scored without it (the rows still share their common part)."""
        static = self.reverse_static_prefix() if self.share_prefix else None
        x_ids = self.input_ids(example)
        reverse_prompts = [
            encode_prompt(self.tokenizer, self.task.reverse_messages(text))
            for text in candidate_texts
        ]
        sequences = [p + x_ids for p in reverse_prompts]
        cached = static.tokens if static is not None else []
        fits = [seq[: len(cached)] == cached for seq in sequences]
        logps: dict[int, torch.Tensor] = {}
        positions = 0
        for prefix, group in ((static, True), (None, False)):
            rows = [i for i, fit in enumerate(fits) if fit == group]
            if not rows:
                continue
            seqs, starts = [sequences[i] for i in rows], [len(reverse_prompts[i]) for i in rows]
            with reference_mode(self.model):
                scored = sequence_logprobs(
                    self.model, seqs, starts, share_prefix=self.share_prefix, prefix=prefix
                )
            logps.update(zip(rows, scored))
            positions += positions_run(seqs, starts, self.share_prefix, prefix)
        return [logps[i] for i in range(len(sequences))], positions

    @torch.no_grad()
    def forward_logprobs(
        self, prompt: list[int], candidates: list[list[int]]
    ) -> list[torch.Tensor]:
        """Per-token log pi_ref(y_t | x, y_<t) of each candidate y (token ids) after `prompt`."""
        static = self.forward_static_prefix(prompt)
        with reference_mode(self.model):
            return sequence_logprobs(
                self.model,
                [prompt + c for c in candidates],
                [len(prompt)] * len(candidates),
                share_prefix=self.share_prefix,
                prefix=static,
            )

    @torch.no_grad()
    def score(
        self,
        example: Example,
        prompt: list[int],
        candidates: list[list[int]],
        candidate_texts: list[str],
        passes: Collection[str] = PASSES,
    ) -> CandidateScores:
        """Score the candidates (token ids, end-of-turn included) of one input x with the
        reference `passes` (direct, reverse)."""
        direct = reverse = ref_logp = None
        if DIRECT in passes:
            forward = self.forward_logprobs(prompt, candidates)
            direct = torch.stack([lp.mean() for lp in forward])
            ref_logp = torch.stack([lp.sum() for lp in forward])
        if REVERSE in passes:
            logps, _ = self.reverse_logprobs(example, candidate_texts)
            reverse = torch.stack([lp.mean() for lp in logps])
        lengths = torch.tensor([len(c) for c in candidates])
        return CandidateScores(direct, reverse, ref_logp, lengths)
