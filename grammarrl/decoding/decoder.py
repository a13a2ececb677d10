"""The batched grammar-constrained decoder: greedy, sampling, beam search and group rollouts.

One loop serves every mode. Each prompt is prefilled once; every row generated from it (greedy,
the N samples, the B beams) reads that prompt's KV cache, kept once per prompt: decode steps run
cascade attention (`cascade.py`) over the shared prompt KV and each row's own generated KV, so
forking, reordering and dropping rows moves only the rows' small generated part. (Models that
cascade attention does not support, and `share_prefix=False`, copy the prompt KV into every row
instead: `cache.CopiedPromptCache`.) At each step all live rows of all prompts go through the
model together (one forward), llguidance fills the token masks of all rows in parallel, and
each row picks its next token by its own rule:

- greedy: arg-max of the masked logits;
- sample: inverse-CDF draw from softmax(masked logits / T), one uniform per row from the
  caller's torch.Generator (reproducible, device independent);
- beam: per prompt, the B best (beam, token) extensions by summed constrained log-prob; the
  end-of-turn token closes a hypothesis. Matchers are forked (`deep_copy`) and the rows' KV
  reordered together.

Finished rows leave the batch (their matchers never see padding). For every generated token the
decoder records the unconstrained log-prob (full-vocabulary softmax of the raw logits), the
constrained one (renormalised over the allowed set) and the log of the allowed mass.

The model side (prefill, the KV cache, one decode step) is `forward.ModelForward`, the base class;
beam search's parts (groups, candidates, forking, a group's step) are in `beam.py`; the outputs
are collected per prompt in `collect.py`. A step's choices are `rows.Choice` values, one per
chosen (row, token), read from one host-side table.
"""

from __future__ import annotations

from typing import Any

import torch

from grammarrl.decoding.beam import BeamGroup, beam_candidates, step_group
from grammarrl.decoding.collect import Outputs, PromptOutputs
from grammarrl.decoding.forward import ModelForward
from grammarrl.decoding.grammar import CompiledGrammar, MaskComputer, grammar_complete
from grammarrl.decoding.rows import (
    BEAM,
    DEAD,
    ERROR,
    FINISHED,
    GREEDY,
    KIND_NAMES,
    LIVE,
    NEG_INF,
    SAMPLE,
    TRUNCATED,
    Choice,
    Row,
    StepDistribution,
    dead_end_reason,
    normalise_prompts,
    sample_tokens,
)
from grammarrl.decoding.types import BeamResult, Generation
from grammarrl.models.chat import end_of_turn_id


def initial_rows(prompts: list[list[int]], kinds: list[int], grammar: CompiledGrammar) -> list[Row]:
    """The rows of each prompt, consecutive, one per kind (greedy, samples, beam), each with its
    own matcher; a sample's index is its number among the prompt's samples."""
    offset = kinds.count(GREEDY)
    return [
        Row(p, kind, j - offset, grammar.matcher(), len(prompt))
        for p, prompt in enumerate(prompts)
        for j, kind in enumerate(kinds)
    ]


class ConstrainedDecoder(ModelForward):
    """Grammar-constrained decoding over a HF causal LM (optionally a PEFT model).

    `grammar` is a Lark string (the task's Outlines CFG) compiled once. Prompts are token-id
    lists from `grammarrl.models.chat.encode_prompt`. Generation stops at the end-of-turn token, which
    the mask allows only where the grammar accepts, or after `max_new_tokens` (truncated). An
    output the grammar has completed within the cap (nothing but the end token may follow) is
    never truncated: it takes its forced end token, one past the cap.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        grammar: Any,
        max_new_tokens: int,
        stop_token_id: int | None = None,
        share_prefix: bool = True,
        cascade: bool | None = None,
    ):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        super().__init__(model, max_new_tokens, share_prefix, cascade)
        self.tokenizer = tokenizer
        self.stop_token_id = int(
            end_of_turn_id(tokenizer) if stop_token_id is None else stop_token_id
        )
        self.grammar = CompiledGrammar(tokenizer, grammar, self.stop_token_id)
        self._masks: MaskComputer | None = None

    # ------------------------------------------------------------------ public API

    def greedy(self, prompts: list[list[int]]) -> list[Generation]:
        return [o.greedy[0] for o in self._decode(prompts, greedy=True)]

    def sample(
        self,
        prompts: list[list[int]],
        num_samples: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        with_greedy: bool = False,
    ) -> list[list[Generation]]:
        """Per prompt: `num_samples` samples; `with_greedy`: the greedy output first, decoded
        with them (one prefill, one batch of rows: the candidate groups of `mode=diagnose`)."""
        outs = self._decode(
            prompts,
            greedy=with_greedy,
            num_samples=num_samples,
            temperature=temperature,
            generator=generator,
        )
        return [o.greedy + o.samples for o in outs]

    def beam(
        self, prompts: list[list[int]], beam_width: int, length_penalty: float
    ) -> list[BeamResult]:
        """Constrained beam search; finished hypotheses are ranked by summed constrained
        log-prob / length**length_penalty (0: the plain sum). No default here: the value is the
        config's (`rollout.length_penalty`, `eval.length_penalty`), given by every caller."""
        outs = self._decode(prompts, beam_width=beam_width, length_penalty=length_penalty)
        return [o.beam for o in outs]

    def rollout(
        self,
        prompts: list[list[int]],
        num_samples: int,
        beam_width: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        *,
        length_penalty: float,
    ) -> list[list[Generation]]:
        """Per prompt: N constrained samples then the constrained beam top-1 (N+1 outputs). The
        prompt is prefilled once; samples and beams decode together, sharing its KV cache."""
        outs = self._decode(
            prompts,
            num_samples=num_samples,
            beam_width=beam_width,
            temperature=temperature,
            generator=generator,
            length_penalty=length_penalty,
        )
        return [o.samples + [o.beam.top] for o in outs]

    # ------------------------------------------------------------------ internals

    def _decode(
        self,
        prompts: list[list[int]],
        greedy: bool = False,
        num_samples: int = 0,
        beam_width: int = 0,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        length_penalty: float | None = None,
    ) -> list[PromptOutputs]:
        if num_samples < 0 or beam_width < 0:
            raise ValueError("num_samples and beam_width must be >= 0")
        if num_samples and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        prompts = normalise_prompts(prompts)
        if not prompts:
            return []
        with self.inference():
            return self._loop(
                prompts, greedy, num_samples, beam_width, temperature, generator, length_penalty
            )

    def _loop(
        self, prompts, greedy, num_samples, beam_width, temperature, generator, length_penalty
    ) -> list[PromptOutputs]:
        """Prefill, then step until every row has ended: mask, choose each row's next token(s)
        by its rule, let the rows take them, reorder the cache for the survivors."""
        kinds = [GREEDY] * int(greedy) + [SAMPLE] * num_samples + [BEAM] * bool(beam_width)
        rows = initial_rows(prompts, kinds, self.grammar)
        groups = {
            p: BeamGroup(p, beam_width, length_penalty) for p in range(len(prompts)) if beam_width
        }
        logits, kv = self.start(prompts, len(rows) // len(prompts))
        outputs = Outputs(len(prompts), num_samples, self.generation)
        while rows:
            dist = self.distribution(logits, [r.matcher for r in rows])
            choices, n_plain, beam_prompts = self._choose(
                dist, rows, temperature, generator, beam_width
            )
            new_rows, new_src = self._continue_plain(outputs, rows, choices[:n_plain])
            per_group = (len(choices) - n_plain) // max(len(beam_prompts), 1)
            for g, p in enumerate(beam_prompts):
                start = n_plain + g * per_group
                group_choices = choices[start : start + per_group]
                for i, child in step_group(
                    groups[p], group_choices, rows, outputs, self.stop_token_id, self.max_new_tokens
                ):
                    new_rows.append(child)
                    new_src.append(i)
            if not new_rows:
                break
            logits = self.advance(kv, rows, new_rows, new_src)
            rows = new_rows
        for group in groups.values():  # groups whose rows all died without a result
            outputs.close_group(group, [])
        return outputs.prompts

    def _choose(
        self,
        dist: StepDistribution,
        rows: list[Row],
        temperature: float,
        generator: torch.Generator | None,
        beam_width: int,
    ) -> tuple[list[Choice], int, list[int]]:
        """Each row's next token by its rule, read from the step's one host-side table: greedy
        then sample rows first (one choice each; their count is returned), then per beam group
        its 2·B best extensions (the groups' prompts are returned, in that order)."""
        device = self.device
        greedy_idx = [i for i, r in enumerate(rows) if r.kind == GREEDY]
        sample_idx = [i for i, r in enumerate(rows) if r.kind == SAMPLE]
        sources, tokens, values = [], [], []
        if greedy_idx:
            index = torch.tensor(greedy_idx, device=device)
            sources.append(index)
            tokens.append(dist.masked.index_select(0, index).argmax(dim=-1))
        if sample_idx:
            index = torch.tensor(sample_idx, device=device)
            sources.append(index)
            tokens.append(sample_tokens(*dist.proposal(temperature, index), generator))
        beam = beam_candidates(dist, rows, beam_width, device)
        if beam is not None:
            sources.append(beam[0])
            tokens.append(beam[1])
            values.append(beam[2])
        src, tok = torch.cat(sources), torch.cat(tokens)  # [K], [K]
        columns = [src, tok, *dist.token_logps(src, tok)]
        if values:
            plain = torch.full((len(greedy_idx) + len(sample_idx),), NEG_INF, device=device)
            columns.append(torch.cat([plain, *values]))
        table = torch.stack([c.double() for c in columns], dim=1).tolist()  # the one host sync
        choices = [Choice.of(line) for line in table]
        return choices, len(greedy_idx) + len(sample_idx), beam[3] if beam is not None else []

    def _continue_plain(
        self, outputs: Outputs, rows: list[Row], choices: list[Choice]
    ) -> tuple[list[Row], list[int]]:
        """Greedy and sample rows take their tokens; the ended ones are emitted. Returns the
        live rows and, for each, the index of the row (cache slot) it continues."""
        new_rows: list[Row] = []
        new_src: list[int] = []
        for choice in choices:
            row = rows[choice.row]
            outcome, error = self.take(row, choice)
            if outcome == LIVE:
                new_rows.append(row)
                new_src.append(choice.row)
            else:
                outputs.emit(
                    row,
                    finished=outcome == FINISHED,
                    truncated=outcome == TRUNCATED,
                    error=error,
                )
        return new_rows, new_src

    # ------------------------------------------------------------------ the step interface
    # (the loop above and SMC, grammarrl/decoding/smc.py, drive decoding through these and
    # through `start` and `advance` of `ModelForward`)

    def distribution(self, logits: torch.Tensor, matchers: list[Any]) -> StepDistribution:
        """The rows' next-token distributions [R, V] under their matchers' grammar masks."""
        stale = self._masks is None or self._masks.width != logits.shape[1]
        if stale or self._masks.device != logits.device:  # the model moved (Lightning's teardown)
            self._masks = MaskComputer(self.grammar, logits.shape[1], logits.device)
        return StepDistribution.of(logits, self._masks.allowed(matchers))  # mask [R, V] bool

    def take(self, row: Row, choice: Choice) -> tuple[str, str | None]:
        """`row` takes the chosen token and its matcher advances. Returns (outcome, error): DEAD (a
        dead end: nothing allowed, or only an unaccepted end token; the token is not taken),
        FINISHED (the end token), ERROR (the matcher refused it), TRUNCATED (max_new_tokens
        reached and the grammar not complete), or LIVE."""
        token = choice.token
        if choice.log_allowed_mass == NEG_INF or (
            token == self.stop_token_id and not row.matcher.is_accepting()
        ):
            return DEAD, dead_end_reason(row)
        row.push(choice)
        if token == self.stop_token_id:
            return FINISHED, None
        if not row.matcher.consume_token(token):
            return ERROR, row.matcher.get_error()
        if len(row.tokens) >= self.max_new_tokens and not grammar_complete(row.matcher):
            return TRUNCATED, None
        return LIVE, None

    def generation(self, row: Row, finished: bool, truncated: bool, error=None) -> Generation:
        """The output of an ended row (its text without the end token)."""
        body = row.tokens[:-1] if finished else row.tokens
        return Generation(
            token_ids=list(row.tokens),
            text=self.grammar.decode(body),
            logp_unconstrained=list(row.logp_unconstrained),
            logp_constrained=list(row.logp_constrained),
            log_allowed_mass=list(row.log_allowed_mass),
            finished=finished,
            truncated=truncated,
            kind=KIND_NAMES[row.kind],
            error=error,
        )
