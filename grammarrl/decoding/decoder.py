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
beam search's parts (groups, candidates, forking) are in `beam.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from grammarrl.decoding.beam import BeamGroup, beam_candidates, best_extensions, fork, rank
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
    Row,
    StepDistribution,
    dead_end_reason,
    normalise_prompts,
    sample_tokens,
)
from grammarrl.decoding.types import BeamResult, Generation
from grammarrl.models.chat import end_of_turn_id

log = logging.getLogger(__name__)


@dataclass
class _Outputs:
    greedy: list[Generation]
    samples: list[Generation]
    beam: BeamResult | None


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
    ) -> list[_Outputs]:
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
    ) -> list[_Outputs]:
        """Prefill, then step until every row has ended: mask, choose each row's next token(s)
        by its rule, let the rows take them, reorder the cache for the survivors."""
        rows, groups = self._initial_rows(prompts, greedy, num_samples, beam_width, length_penalty)
        logits, kv = self.start(prompts, len(rows) // len(prompts))
        outputs = [_Outputs([], [None] * num_samples, None) for _ in prompts]
        while rows:
            dist = self.distribution(logits, [r.matcher for r in rows])
            table, n_plain, beam_prompts = self._choose(
                dist, rows, temperature, generator, beam_width
            )
            new_rows, new_src = self._continue_plain(outputs, rows, table[:n_plain])
            per_group = (len(table) - n_plain) // max(len(beam_prompts), 1)
            for g, p in enumerate(beam_prompts):
                entries = table[n_plain + g * per_group : n_plain + (g + 1) * per_group]
                self._beam_step(outputs, groups[p], entries, rows, new_rows, new_src)
            if not new_rows:
                break
            logits = self.advance(kv, rows, new_rows, new_src)
            rows = new_rows
        for group in groups.values():  # groups whose rows all died without a result
            if group.result is None:
                self._close_group(outputs, group, [])
        return outputs

    def _initial_rows(
        self, prompts, greedy, num_samples, beam_width, length_penalty
    ) -> tuple[list[Row], dict[int, BeamGroup]]:
        """The rows of each prompt, consecutive (greedy, samples, beam), and its beam group."""
        rows: list[Row] = []
        groups: dict[int, BeamGroup] = {}
        kinds = [GREEDY] * int(greedy) + [SAMPLE] * num_samples + [BEAM] * bool(beam_width)
        for p, prompt in enumerate(prompts):
            for j, kind in enumerate(kinds):
                rows.append(Row(p, kind, j - int(greedy), self.grammar.matcher(), len(prompt)))
            if beam_width:
                groups[p] = BeamGroup(p, beam_width, length_penalty)
        return rows, groups

    def _choose(
        self,
        dist: StepDistribution,
        rows: list[Row],
        temperature: float,
        generator: torch.Generator | None,
        beam_width: int,
    ) -> tuple[list[list[float]], int, list[int]]:
        """Each row's next token by its rule: the step's one host-side table, a line per
        chosen (row, token): [row index, token, logp_unconstrained, logp_constrained,
        log_allowed_mass(, beam score)]. Greedy then sample rows first (one line each; their
        count is returned), then per beam group its 2·B best extensions (the groups' prompts
        are returned, in table order)."""
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
        return table, len(greedy_idx) + len(sample_idx), beam[3] if beam is not None else []

    def _continue_plain(
        self, outputs, rows: list[Row], entries: list[list[float]]
    ) -> tuple[list[Row], list[int]]:
        """Greedy and sample rows take their tokens; the ended ones are emitted. Returns the
        live rows and, for each, the index of the row (cache slot) it continues."""
        new_rows: list[Row] = []
        new_src: list[int] = []
        for entry in entries:
            i = int(entry[0])
            row = rows[i]
            outcome, error = self.take(row, int(entry[1]), entry[2], entry[3], entry[4])
            if outcome == LIVE:
                new_rows.append(row)
                new_src.append(i)
            else:
                self._emit(
                    outputs,
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

    def take(
        self,
        row: Row,
        token: int,
        logp_unconstrained: float,
        logp_constrained: float,
        log_allowed_mass: float,
    ) -> tuple[str, str | None]:
        """`row` takes `token` and its matcher advances. Returns (outcome, error): DEAD (a
        dead end: nothing allowed, or only an unaccepted end token; the token is not taken),
        FINISHED (the end token), ERROR (the matcher refused it), TRUNCATED (max_new_tokens
        reached and the grammar not complete), or LIVE."""
        if log_allowed_mass == NEG_INF or (
            token == self.stop_token_id and not row.matcher.is_accepting()
        ):
            return DEAD, dead_end_reason(row)
        row.push(token, logp_unconstrained, logp_constrained, log_allowed_mass)
        if token == self.stop_token_id:
            return FINISHED, None
        if not row.matcher.consume_token(token):
            return ERROR, row.matcher.get_error()
        if len(row.tokens) >= self.max_new_tokens and not grammar_complete(row.matcher):
            return TRUNCATED, None
        return LIVE, None

    def _beam_step(
        self,
        outputs,
        group: BeamGroup,
        entries: list[list[float]],
        rows: list[Row],
        new_rows: list[Row],
        new_src: list[int],
    ) -> None:
        """One prompt's beam: end-token candidates among the best B become finished hypotheses;
        the B best other extensions fork their parents' rows (appended to `new_rows`)."""
        max_new, width = self.max_new_tokens, group.width
        extensions = best_extensions(group, entries, rows, self.stop_token_id, self.generation)
        finished = group.finished
        # Done when no live beam can still beat the width-th finished one (HF's heuristic: the
        # best live score at its current length).
        if (
            not extensions
            or len(finished) >= width
            and group.score(extensions[0][5], len(rows[extensions[0][0]].tokens) + 1)
            <= rank(group, finished[width - 1])
        ):
            self._close_group(outputs, group, [])
            return
        children = fork(rows, extensions)  # each child's token not yet consumed
        live = []
        for i, child in children:
            if not child.matcher.consume_token(child.tokens[-1]):
                log.warning("beam matcher error: %s", child.matcher.get_error())
                continue
            live.append((i, child))
        if not live:
            self._close_group(outputs, group, [])
            return
        if len(live[0][1].tokens) >= max_new:  # all beams have the same length
            complete = [(i, c) for i, c in live if grammar_complete(c.matcher)]
            if not complete:
                self._close_group(outputs, group, [c for _, c in live])
                return
            live = complete  # they take their forced end token in the next step
        for i, child in live:
            new_rows.append(child)
            new_src.append(i)

    def _close_group(self, outputs, group: BeamGroup, truncated: list[Row]) -> None:
        if group.result is not None:
            return
        if group.finished:
            top = group.finished[0]
        elif truncated:
            best = max(truncated, key=lambda r: r.score)
            top = self.generation(best, finished=False, truncated=True)
        else:
            top = Generation([], "", [], [], [], False, False, "beam", error="no beam survived")
        group.result = BeamResult(top=top, finished=list(group.finished))
        outputs[group.prompt].beam = group.result

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

    def _emit(self, outputs, row: Row, finished: bool, truncated: bool, error=None) -> None:
        if error:
            log.warning("constrained decoding stopped early: %s", error)
        gen = self.generation(row, finished, truncated, error)
        target = outputs[row.prompt]
        if row.kind == GREEDY:
            target.greedy.append(gen)
        else:
            target.samples[row.index] = gen
