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

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from grammarrl.chat import end_of_turn_id
from grammarrl.decoding.cache import CopiedPromptCache, layer_tensors, reorder_suffix, select_rows
from grammarrl.decoding.cascade import (
    CACHE_KWARG,
    SharedPromptCache,
    cascade_attention,
    model_configs,
    supports_cascade,
)
from grammarrl.decoding.grammar import CompiledGrammar, MaskComputer, grammar_complete
from grammarrl.decoding.types import BeamResult, Generation
from grammarrl.models import output_kv_cache, with_kv_cache

log = logging.getLogger(__name__)

GREEDY, SAMPLE, BEAM = 0, 1, 2
_KIND_NAMES = {GREEDY: "greedy", SAMPLE: "sample", BEAM: "beam"}
NEG_INF = float("-inf")


class _Row:
    """A live row: one partial output with its matcher and its place in the KV cache."""

    __slots__ = (
        "index",
        "kind",
        "lc",
        "lm",
        "lu",
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
        self.lu: list[float] = []
        self.lc: list[float] = []
        self.lm: list[float] = []
        self.score = 0.0  # sum of constrained log-probs (the beam score)
        self.plen = plen  # prompt length: position id of the first generated token

    def child(self, matcher: Any) -> _Row:
        row = _Row(self.prompt, self.kind, self.index, matcher, self.plen)
        row.tokens = list(self.tokens)
        row.lu, row.lc, row.lm = list(self.lu), list(self.lc), list(self.lm)
        row.score = self.score
        return row

    def push(self, token: int, lu: float, lc: float, lm: float) -> None:
        self.tokens.append(token)
        self.lu.append(lu)
        self.lc.append(lc)
        self.lm.append(lm)
        self.score += lc


class _BeamGroup:
    __slots__ = ("finished", "length_penalty", "prompt", "result", "width")

    def __init__(self, prompt: int, width: int, length_penalty: float):
        self.prompt = prompt
        self.width = width
        self.length_penalty = length_penalty
        self.finished: list[Generation] = []  # kept sorted by beam_score, best first
        self.result: BeamResult | None = None

    def score(self, sum_logp: float, length: int) -> float:
        """A hypothesis' rank: summed constrained log-prob / length**length_penalty."""
        return sum_logp / length**self.length_penalty if self.length_penalty else sum_logp


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
        prompts = [list(map(int, p)) for p in prompts]
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        if not prompts:
            return []
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                return self._loop(prompts, greedy, num_samples, beam_width, temperature,
                                  generator, length_penalty)
        finally:
            if was_training:
                model.train()

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
              length_penalty):
        device = self.device
        stop = self.stop_token_id
        max_new = self.max_new_tokens
        grammar = self.grammar

        # Rows of each prompt (greedy, samples, beam), consecutive; `_start` prefills the prompts.
        rows: list[_Row] = []
        groups: dict[int, _BeamGroup] = {}
        per_prompt_kinds = [GREEDY] * int(greedy) + [SAMPLE] * num_samples
        per_prompt_kinds += [BEAM] if beam_width else []
        for p, prompt in enumerate(prompts):
            for j, kind in enumerate(per_prompt_kinds):
                rows.append(_Row(p, kind, j - int(greedy), grammar.matcher(), len(prompt)))
            if beam_width:
                groups[p] = _BeamGroup(p, beam_width, length_penalty)
        logits, kv = self._start(prompts, len(per_prompt_kinds))

        if self._masks is None or self._masks.width != logits.shape[1]:
            self._masks = MaskComputer(grammar, logits.shape[1], device)
        masks = self._masks
        vocab = logits.shape[1]

        outputs = [_Outputs([], [None] * num_samples, None) for _ in prompts]
        while rows:
            allowed = masks.allowed([r.matcher for r in rows])
            lse_all = torch.logsumexp(logits, dim=-1)
            masked = torch.where(allowed, logits, NEG_INF)
            lse_allowed = torch.logsumexp(masked, dim=-1)
            lse_safe = torch.where(lse_allowed.isfinite(), lse_allowed, 0.0)  # dead rows

            greedy_idx = [i for i, r in enumerate(rows) if r.kind == GREEDY]
            sample_idx = [i for i, r in enumerate(rows) if r.kind == SAMPLE]
            src_parts, tok_parts, value_parts = [], [], []
            if greedy_idx:
                index = torch.tensor(greedy_idx, device=device)
                src_parts.append(index)
                tok_parts.append(masked.index_select(0, index).argmax(dim=-1))
            if sample_idx:
                index = torch.tensor(sample_idx, device=device)
                src_parts.append(index)
                sub = masked.index_select(0, index)
                if temperature == 1.0:
                    log_norm = lse_safe.index_select(0, index)
                else:
                    sub = sub / temperature
                    log_norm = torch.logsumexp(sub, dim=-1)
                    log_norm = torch.where(log_norm.isfinite(), log_norm, 0.0)
                tok_parts.append(_sample(sub, log_norm, generator))
            beam_rows: dict[int, list[int]] = {}
            for i, r in enumerate(rows):
                if r.kind == BEAM:
                    beam_rows.setdefault(r.prompt, []).append(i)
            if beam_rows:
                order = list(beam_rows)
                slots = max(len(v) for v in beam_rows.values())
                grid = [beam_rows[p] + [-1] * (slots - len(beam_rows[p])) for p in order]
                grid_t = torch.tensor(grid, device=device)
                safe = grid_t.clamp(min=0)
                scores = torch.tensor(
                    [[rows[i].score if i >= 0 else NEG_INF for i in g] for g in grid],
                    device=device,
                    dtype=torch.float32,
                )
                logp_c = masked[safe] - lse_safe[safe].unsqueeze(-1)  # [G, slots, V]
                cand = (scores.unsqueeze(-1) + logp_c).view(len(order), -1)
                k = min(2 * beam_width, cand.shape[1])
                values, flat = cand.topk(k, dim=-1)
                slot = torch.div(flat, vocab, rounding_mode="floor")
                src_parts.append(safe.gather(1, slot).view(-1))
                tok_parts.append((flat % vocab).view(-1))
                value_parts.append(values.view(-1))

            src = torch.cat(src_parts)
            tok = torch.cat(tok_parts)
            chosen = logits[src, tok]
            lu = chosen - lse_all[src]
            lc = chosen - lse_allowed[src]
            lm = lse_allowed[src] - lse_all[src]
            columns = [src.double(), tok.double(), lu.double(), lc.double(), lm.double()]
            if value_parts:
                vals = torch.cat(value_parts).double()
                none = torch.full((len(greedy_idx) + len(sample_idx),), NEG_INF, device=device)
                columns.append(torch.cat([none.double(), vals]))
            table = torch.stack(columns, dim=1).tolist()  # the one host sync of the step

            new_rows: list[_Row] = []
            new_src: list[int] = []
            n_plain = len(greedy_idx) + len(sample_idx)
            for entry in table[:n_plain]:
                i, t = int(entry[0]), int(entry[1])
                row = rows[i]
                if entry[4] == NEG_INF or (t == stop and not row.matcher.is_accepting()):
                    # The grammar is at a dead end: nothing allowed, or only the end token
                    # (llguidance's stop) where the output is not accepted.
                    self._emit(outputs, row, finished=False, truncated=False, error=_dead(row))
                    continue
                row.push(t, entry[2], entry[3], entry[4])
                if t == stop:
                    self._emit(outputs, row, finished=True, truncated=False)
                elif not row.matcher.consume_token(t):
                    self._emit(outputs, row, False, False, error=row.matcher.get_error())
                elif len(row.tokens) >= max_new and not grammar_complete(row.matcher):
                    self._emit(outputs, row, finished=False, truncated=True)
                else:
                    new_rows.append(row)
                    new_src.append(i)

            if beam_rows:
                per_group = len(table[n_plain:]) // len(order)
                for g_idx, p in enumerate(order):
                    entries = table[n_plain + g_idx * per_group : n_plain + (g_idx + 1) * per_group]
                    self._beam_step(
                        outputs, groups, p, entries, rows, new_rows, new_src, stop, max_new
                    )

            if not new_rows:
                break
            self._reorder(kv, [r.prompt for r in rows], [r.prompt for r in new_rows], new_src,
                          len(new_rows[0].tokens) - 1)
            rows = new_rows
            logits = self._step(kv, rows)

        for group in groups.values():  # groups whose rows all died without a result
            if group.result is None:
                self._close_group(outputs, group, [])
        return outputs

    def _start(self, prompts: list[list[int]], rows_per_prompt: int
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

    def _step(self, kv, rows: list[_Row]) -> torch.Tensor:
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

    def _beam_step(self, outputs, groups, p, entries, rows, new_rows, new_src, stop, max_new):
        group = groups[p]
        width = group.width
        extensions = []  # (parent batch index, token, lu, lc, lm, score), best first
        for rank, entry in enumerate(entries):
            i, t, lu, lc, lm, value = entry
            if value == NEG_INF:
                break
            i, t = int(i), int(t)
            if t == stop:
                if rank < width and rows[i].matcher.is_accepting():  # else a dead end: dropped
                    hyp = rows[i].child(None)
                    hyp.push(t, lu, lc, lm)
                    _insort(group, self._generation(hyp, True, False))
                continue
            extensions.append((i, t, lu, lc, lm, value))
            if len(extensions) == width:
                break
        finished = group.finished
        # Done when no live beam can still beat the width-th finished one (HF's heuristic: the
        # best live score at its current length).
        if not extensions or len(finished) >= width and group.score(
            extensions[0][5], len(rows[extensions[0][0]].tokens) + 1
        ) <= _rank(group, finished[width - 1]):
            self._close_group(outputs, group, [])
            return
        # Fork matchers: every child but the last of a parent gets a deep copy, taken before
        # any child consumes its token.
        children_left: dict[int, int] = {}
        for ext in extensions:
            children_left[ext[0]] = children_left.get(ext[0], 0) + 1
        children = []
        for i, t, lu, lc, lm, _ in extensions:
            parent = rows[i]
            children_left[i] -= 1
            matcher = parent.matcher if children_left[i] == 0 else parent.matcher.deep_copy()
            child = parent.child(matcher)
            child.push(t, lu, lc, lm)
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

    def _close_group(self, outputs, group: _BeamGroup, truncated: list[_Row]) -> None:
        if group.result is not None:
            return
        if group.finished:
            top = group.finished[0]
        elif truncated:
            best = max(truncated, key=lambda r: r.score)
            top = self._generation(best, finished=False, truncated=True)
        else:
            top = Generation([], "", [], [], [], False, False, "beam", error="no beam survived")
        group.result = BeamResult(top=top, finished=list(group.finished))
        outputs[group.prompt].beam = group.result

    def _generation(self, row: _Row, finished: bool, truncated: bool, error=None) -> Generation:
        body = row.tokens[:-1] if finished else row.tokens
        return Generation(
            token_ids=list(row.tokens),
            text=self.grammar.decode(body),
            logp_unconstrained=list(row.lu),
            logp_constrained=list(row.lc),
            log_allowed_mass=list(row.lm),
            finished=finished,
            truncated=truncated,
            kind=_KIND_NAMES[row.kind],
            error=error,
        )

    def _emit(self, outputs, row: _Row, finished: bool, truncated: bool, error=None) -> None:
        if error:
            log.warning("constrained decoding stopped early: %s", error)
        gen = self._generation(row, finished, truncated, error)
        target = outputs[row.prompt]
        if row.kind == GREEDY:
            target.greedy.append(gen)
        else:
            target.samples[row.index] = gen


def plan_cache_update(old_prompts: list[int], new_prompts: list[int], sources: list[int],
                      trim: int) -> str:
    """How the batched cache must change between steps, given each slot's prompt before and
    after and the slot each new row continues (`sources`):

    - "keep": every row continues from its own slot;
    - "suffix": only the generated columns move (`reorder_suffix`). Valid only when every slot
      keeps a row of the same prompt, so its prompt KV and padding stay right: beams re-ranked
      within their prompts;
    - "rows": whole rows are gathered (`select_rows`), for any other change.

    (`trim`: left-padding columns dropped, copied rows only. With the shared prompt KV of
    cascade decoding, "suffix" and "rows" both gather the rows' generated KV; each row reads
    the prompt KV of the prompt it belongs to.)
    """
    if sources == list(range(len(old_prompts))):
        return "keep"
    if not trim and old_prompts == new_prompts:
        return "suffix"
    return "rows"


def _rank(group: _BeamGroup, gen: Generation) -> float:
    return group.score(gen.sum_logp_constrained, len(gen.token_ids))


def _insort(group: _BeamGroup, gen: Generation) -> None:
    """Insert into the group's finished list keeping best-first order (stable: earlier
    hypotheses win ties)."""
    finished, score = group.finished, _rank(group, gen)
    pos = len(finished)
    while pos > 0 and _rank(group, finished[pos - 1]) < score:
        pos -= 1
    finished.insert(pos, gen)


def _dead(row: _Row) -> str:
    """A one-line reason for a dead end (llguidance's message can span a state dump)."""
    matcher = row.matcher
    err = matcher.get_error().splitlines()[0] if matcher is not None and matcher.is_error() else ""
    return err or f"the grammar allows no continuation after {len(row.tokens)} tokens (dead end)"


def _sample(
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
