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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from grammarrl.chat import end_of_turn_id
from grammarrl.decoding.beam import BeamGroup, insort, rank
from grammarrl.decoding.cache import (
    CopiedPromptCache,
    layer_tensors,
    plan_cache_update,
    reorder_suffix,
    select_rows,
)
from grammarrl.decoding.cascade import (
    CACHE_KWARG,
    SharedPromptCache,
    cascade_attention,
    model_configs,
    supports_cascade,
)
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
from grammarrl.models import output_kv_cache, with_kv_cache

log = logging.getLogger(__name__)


@dataclass
class _Outputs:
    greedy: list[Generation]
    samples: list[Generation]
    beam: BeamResult | None


class ConstrainedDecoder:
    """Grammar-constrained decoding over a HF causal LM (optionally a PEFT model).

    `grammar` is a Lark string (the task's Outlines CFG) compiled once. Prompts are token-id
    lists from `grammarrl.chat.encode_prompt`. Generation stops at the end-of-turn token, which
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
        self.model = model
        self.tokenizer = tokenizer
        self.stop_token_id = int(
            end_of_turn_id(tokenizer) if stop_token_id is None else stop_token_id
        )
        self.grammar = CompiledGrammar(tokenizer, grammar, self.stop_token_id)
        self.max_new_tokens = int(max_new_tokens)
        self._masks: MaskComputer | None = None
        self._configs: list | None = None  # the model's configs, for the attention switch
        # Prompts of one call sharing at least this many leading tokens prefill them once.
        self.min_shared_prefix = 32
        # False: every row prefills its own prompt, as `generate(num_return_sequences=...)` does
        # (the reference point of the sharing benchmark; same outputs, more compute).
        self.share_prefix = share_prefix
        # With prefix sharing, keep each prompt's KV once and decode with cascade attention
        # (None: wherever the model supports it; False: copy the prompt KV into every row, the
        # layout of `share_prefix=False`, same outputs; True: required).
        self.cascade = cascade
        # Cost accounting: model forward calls and token positions run (prefill tokens + one per
        # decoded row per step), accumulated over the decoder's life; read and diff freely.
        self.forward_calls = 0
        self.forward_tokens = 0

    # ------------------------------------------------------------------ public API

    def greedy(self, prompts: list[list[int]]) -> list[Generation]:
        return [o.greedy[0] for o in self._decode(prompts, greedy=True)]

    def sample(
        self,
        prompts: list[list[int]],
        num_samples: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> list[list[Generation]]:
        outs = self._decode(
            prompts, num_samples=num_samples, temperature=temperature, generator=generator
        )
        return [o.samples for o in outs]

    def beam(self, prompts: list[list[int]], beam_width: int, length_penalty: float = 0.0
             ) -> list[BeamResult]:
        """Constrained beam search; finished hypotheses are ranked by summed constrained
        log-prob / length**length_penalty (0: the plain sum; HF `generate` defaults to 1)."""
        outs = self._decode(prompts, beam_width=beam_width, length_penalty=length_penalty)
        return [o.beam for o in outs]

    def rollout(
        self,
        prompts: list[list[int]],
        num_samples: int,
        beam_width: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        length_penalty: float = 0.0,
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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _decode(
        self,
        prompts: list[list[int]],
        greedy: bool = False,
        num_samples: int = 0,
        beam_width: int = 0,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        length_penalty: float = 0.0,
    ) -> list[_Outputs]:
        if num_samples < 0 or beam_width < 0:
            raise ValueError("num_samples and beam_width must be >= 0")
        if num_samples and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        prompts = normalise_prompts(prompts)
        if not prompts:
            return []
        with self.inference():
            return self._loop(prompts, greedy, num_samples, beam_width, temperature, generator,
                              length_penalty)

    @contextlib.contextmanager
    def inference(self) -> Iterator[None]:
        """One decoding call: the model in eval and inference mode, its mode restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            if was_training:
                self.model.train()

    def _forward(self, input_ids, attention_mask, position_ids, cache, last_only=False, **kwargs):
        if last_only:
            kwargs["logits_to_keep"] = 1
        self.forward_calls += 1
        self.forward_tokens += int(input_ids.numel())
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **with_kv_cache(cache),
            **kwargs,
        )
        return out.logits[:, -1, :].float(), output_kv_cache(out)

    def _prefill(
        self, prompt: list[int], prefix: tuple[int, list] | None = None
    ) -> tuple[torch.Tensor, DynamicCache]:
        """Last-position logits and the KV cache of `prompt`; `prefix` = (length, per-layer
        (keys, values)) of an already computed first part of it, continued from a copy."""
        device = self.device
        start, cache = 0, DynamicCache()
        if prefix is not None:
            start, tensors = prefix
            cache = DynamicCache(ddp_cache_data=tensors)  # copies: the prefix stays intact
        ids = torch.tensor([prompt[start:]], dtype=torch.long, device=device)
        mask = torch.ones((1, len(prompt)), dtype=torch.long, device=device)
        positions = torch.arange(start, len(prompt), device=device).unsqueeze(0)
        return self._forward(ids, mask, positions, cache, last_only=True)

    def _shared_prefix(self, prompts: list[list[int]]) -> tuple[int, list] | None:
        """The KV cache of the longest common prefix of the prompts of this call (a static
        system prompt, hierarchy, demonstrations), computed once; None if too short. Never
        reused across calls: the model's weights may have changed in between."""
        if len(prompts) < 2:
            return None
        first = prompts[0]
        shared = min(len(p) for p in prompts) - 1  # keep >= 1 token per prompt to prefill
        for p in prompts[1:]:
            n = 0
            limit = min(shared, len(p))
            while n < limit and p[n] == first[n]:
                n += 1
            shared = n
            if shared < self.min_shared_prefix:
                return None
        _, cache = self._prefill(first[:shared])
        return shared, layer_tensors(cache)

    def _loop(self, prompts, greedy, num_samples, beam_width, temperature, generator,
              length_penalty) -> list[_Outputs]:
        """Prefill, then step until every row has ended: mask, choose each row's next token(s)
        by its rule, let the rows take them, reorder the cache for the survivors."""
        rows, groups = self._initial_rows(prompts, greedy, num_samples, beam_width,
                                          length_penalty)
        logits, kv = self.start(prompts, len(rows) // len(prompts))
        outputs = [_Outputs([], [None] * num_samples, None) for _ in prompts]
        while rows:
            dist = self.distribution(logits, [r.matcher for r in rows])
            table, n_plain, beam_prompts = self._choose(dist, rows, temperature, generator,
                                                        beam_width)
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

    def _initial_rows(self, prompts, greedy, num_samples, beam_width, length_penalty
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

    def _choose(self, dist: StepDistribution, rows: list[Row], temperature: float,
                generator: torch.Generator | None, beam_width: int
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
        beam = self._beam_candidates(dist, rows, beam_width)
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

    def _beam_candidates(self, dist: StepDistribution, rows: list[Row], beam_width: int):
        """Per beam group (prompt), its 2·B best (beam, token) extensions by summed
        constrained log-prob: rows [G·k], tokens [G·k], scores [G·k] and the groups' prompts;
        None without beam rows."""
        by_prompt: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            if r.kind == BEAM:
                by_prompt.setdefault(r.prompt, []).append(i)
        if not by_prompt:
            return None
        device, vocab = self.device, dist.logits.shape[1]
        order = list(by_prompt)
        slots = max(len(v) for v in by_prompt.values())
        grid = [by_prompt[p] + [-1] * (slots - len(by_prompt[p])) for p in order]
        safe = torch.tensor(grid, device=device).clamp(min=0)  # [G, slots] row index
        scores = torch.tensor([[rows[i].score if i >= 0 else NEG_INF for i in g] for g in grid],
                              device=device, dtype=torch.float32)  # [G, slots]
        logp_c = dist.masked[safe] - dist.lse_safe[safe].unsqueeze(-1)  # [G, slots, V]
        cand = (scores.unsqueeze(-1) + logp_c).view(len(order), -1)  # [G, slots·V]
        values, flat = cand.topk(min(2 * beam_width, cand.shape[1]), dim=-1)  # [G, k]
        slot = torch.div(flat, vocab, rounding_mode="floor")  # [G, k]
        return (safe.gather(1, slot).view(-1), (flat % vocab).view(-1), values.view(-1), order)

    def _continue_plain(self, outputs, rows: list[Row], entries: list[list[float]]
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
                self._emit(outputs, row, finished=outcome == FINISHED,
                           truncated=outcome == TRUNCATED, error=error)
        return new_rows, new_src

    # ------------------------------------------------------------------ the step interface
    # (the loop above and SMC, grammarrl/decoding/smc.py, drive decoding through these)

    def distribution(self, logits: torch.Tensor, matchers: list[Any]) -> StepDistribution:
        """The rows' next-token distributions [R, V] under their matchers' grammar masks."""
        if self._masks is None or self._masks.width != logits.shape[1]:
            self._masks = MaskComputer(self.grammar, logits.shape[1], self.device)
        return StepDistribution.of(logits, self._masks.allowed(matchers))  # mask [R, V] bool

    def take(self, row: Row, token: int, logp_unconstrained: float, logp_constrained: float,
             log_allowed_mass: float) -> tuple[str, str | None]:
        """`row` takes `token` and its matcher advances. Returns (outcome, error): DEAD (a
        dead end: nothing allowed, or only an unaccepted end token; the token is not taken),
        FINISHED (the end token), ERROR (the matcher refused it), TRUNCATED (max_new_tokens
        reached and the grammar not complete), or LIVE."""
        if log_allowed_mass == NEG_INF or (
                token == self.stop_token_id and not row.matcher.is_accepting()):
            return DEAD, dead_end_reason(row)
        row.push(token, logp_unconstrained, logp_constrained, log_allowed_mass)
        if token == self.stop_token_id:
            return FINISHED, None
        if not row.matcher.consume_token(token):
            return ERROR, row.matcher.get_error()
        if len(row.tokens) >= self.max_new_tokens and not grammar_complete(row.matcher):
            return TRUNCATED, None
        return LIVE, None

    def advance(self, kv, rows: list[Row], new_rows: list[Row], sources: list[int]
                ) -> torch.Tensor:
        """The next step: new row i continues `rows[sources[i]]` (rows dropped, reordered or
        forked); the cache follows, then one decode step. The new rows' logits [R', V]."""
        self._reorder(kv, [r.prompt for r in rows], [r.prompt for r in new_rows], sources,
                      len(new_rows[0].tokens) - 1)
        return self._step(kv, new_rows)

    def start(self, prompts: list[list[int]], rows_per_prompt: int
               ) -> tuple[torch.Tensor, SharedPromptCache | CopiedPromptCache]:
        """Prefill the prompts: the first logits of every row (rows of a prompt consecutive,
        `rows_per_prompt` each) and the batch's KV cache. With prefix sharing each prompt is run
        once (a common prefix of the prompts once in all) and its KV kept once (cascade) or
        copied into its rows; without, every row prefills its own prompt."""
        prefix = self._shared_prefix(prompts) if self.share_prefix else None
        copies = 1 if self.share_prefix else rows_per_prompt  # prefills per prompt
        first_logits, caches, lengths, repeats = [], [], [], []
        for prompt in prompts:
            for _ in range(copies):
                logits, cache = self._prefill(prompt, prefix)
                first_logits.append(logits.expand(rows_per_prompt // copies, -1))
                caches.append(cache)
                lengths.append(len(prompt))
                repeats.append(rows_per_prompt // copies)
        del prefix
        logits = torch.cat(first_logits, dim=0)
        if not self._use_cascade():
            return logits, CopiedPromptCache(caches, lengths, repeats)
        self._configs = model_configs(self.model)
        kv = SharedPromptCache([layer_tensors(c) for c in caches],
                               capacity=min(self.max_new_tokens + 1, 64))
        kv.select([p for p in range(len(prompts)) for _ in range(rows_per_prompt)])
        return logits, kv

    def _use_cascade(self) -> bool:
        if not self.share_prefix or self.cascade is False:
            return False
        supported = supports_cascade(self.model)
        if self.cascade and not supported:
            raise ValueError("cascade=True, but the model's attention cannot be replaced by "
                             "cascade attention (see grammarrl/decoding/cascade.py)")
        return supported

    def _reorder(self, kv, old_prompts: list[int], new_prompts: list[int], sources: list[int],
                 generated: int) -> None:
        """Rows of the next step: new row i continues old row `sources[i]` (dropped, reordered
        or forked rows); `generated` = tokens already in the cache per row."""
        if isinstance(kv, SharedPromptCache):
            plan = plan_cache_update(old_prompts, new_prompts, sources, 0)
            kv.select(new_prompts, None if plan == "keep" else sources)
            return
        # Copied rows: also trim the left padding no row needs any more.
        trim = min(kv.pads[s] for s in sources)
        plan = plan_cache_update(old_prompts, new_prompts, sources, trim)
        device = self.device
        if plan == "suffix" and not reorder_suffix(
                kv.cache, torch.tensor(sources, device=device), generated):
            plan = "rows"
        if plan == "rows" or trim:
            index = None if plan == "keep" else torch.tensor(sources, device=device)
            select_rows(kv.cache, index, trim)
        kv.pads = [kv.pads[s] - trim for s in sources]

    def _step(self, kv, rows: list[Row]) -> torch.Tensor:
        """One decode step of `rows` (each feeds its last token): next-token logits."""
        device = self.device
        input_ids = torch.tensor([[r.tokens[-1]] for r in rows], device=device)
        positions = torch.tensor([[r.plen + len(r.tokens) - 1] for r in rows], device=device)
        if isinstance(kv, SharedPromptCache):
            with cascade_attention(self._configs):
                logits, _ = self._forward(input_ids, None, positions, kv, **{CACHE_KWARG: kv})
            return logits
        logits, kv.cache = self._forward(input_ids, kv.attention_mask(device), positions,
                                         kv.cache)
        return logits

    def _beam_step(self, outputs, group: BeamGroup, entries: list[list[float]], rows: list[Row],
                   new_rows: list[Row], new_src: list[int]) -> None:
        """One prompt's beam: end-token candidates among the best B become finished hypotheses;
        the B best other extensions fork their parents' rows (appended to `new_rows`)."""
        stop, max_new, width = self.stop_token_id, self.max_new_tokens, group.width
        extensions = []  # (parent row index, token, logp_u, logp_c, mass, score), best first
        for position, entry in enumerate(entries):
            i, t, logp_u, logp_c, mass, value = entry
            if value == NEG_INF:
                break
            i, t = int(i), int(t)
            if t == stop:
                if position < width and rows[i].matcher.is_accepting():  # else a dead end: dropped
                    hyp = rows[i].child(None)
                    hyp.push(t, logp_u, logp_c, mass)
                    insort(group, self.generation(hyp, True, False))
                continue
            extensions.append((i, t, logp_u, logp_c, mass, value))
            if len(extensions) == width:
                break
        finished = group.finished
        # Done when no live beam can still beat the width-th finished one (HF's heuristic: the
        # best live score at its current length).
        if not extensions or len(finished) >= width and group.score(
            extensions[0][5], len(rows[extensions[0][0]].tokens) + 1
        ) <= rank(group, finished[width - 1]):
            self._close_group(outputs, group, [])
            return
        # Fork matchers: every child but the last of a parent gets a deep copy, taken before
        # any child consumes its token.
        children_left: dict[int, int] = {}
        for ext in extensions:
            children_left[ext[0]] = children_left.get(ext[0], 0) + 1
        children = []
        for i, t, logp_u, logp_c, mass, _ in extensions:
            parent = rows[i]
            children_left[i] -= 1
            matcher = parent.matcher if children_left[i] == 0 else parent.matcher.deep_copy()
            child = parent.child(matcher)
            child.push(t, logp_u, logp_c, mass)
            children.append((i, child))
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
