"""Beam search's parts: a prompt's group of finished hypotheses (ranked best first), the best
extensions of its beams at a step, forking the rows that continue them, and one step of a
group (`step_group`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from grammarrl.decoding.collect import Outputs
from grammarrl.decoding.grammar import grammar_complete
from grammarrl.decoding.rows import BEAM, NEG_INF, Choice, Row, StepDistribution
from grammarrl.decoding.types import BeamResult, Generation

log = logging.getLogger(__name__)


class BeamGroup:
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


def rank(group: BeamGroup, gen: Generation) -> float:
    return group.score(gen.sum_logp_constrained, len(gen.token_ids))


def insort(group: BeamGroup, gen: Generation) -> None:
    """Insert into the group's finished list keeping best-first order (stable: earlier
    hypotheses win ties)."""
    finished, score = group.finished, rank(group, gen)
    pos = len(finished)
    while pos > 0 and rank(group, finished[pos - 1]) < score:
        pos -= 1
    finished.insert(pos, gen)


def beam_candidates(
    dist: StepDistribution, rows: list[Row], beam_width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]] | None:
    """Per beam group (prompt), its 2·B best (beam, token) extensions by summed
    constrained log-prob: rows [G·k], tokens [G·k], scores [G·k] and the groups' prompts;
    None without beam rows."""
    by_prompt: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r.kind == BEAM:
            by_prompt.setdefault(r.prompt, []).append(i)
    if not by_prompt:
        return None
    vocab = dist.logits.shape[1]
    order = list(by_prompt)
    slots = max(len(v) for v in by_prompt.values())
    grid = [by_prompt[p] + [-1] * (slots - len(by_prompt[p])) for p in order]
    safe = torch.tensor(grid, device=device).clamp(min=0)  # [G, slots] row index
    scores = torch.tensor(
        [[rows[i].score if i >= 0 else NEG_INF for i in g] for g in grid],
        device=device,
        dtype=torch.float32,
    )  # [G, slots]
    logp_c = dist.masked[safe] - dist.lse_safe[safe].unsqueeze(-1)  # [G, slots, V]
    cand = (scores.unsqueeze(-1) + logp_c).view(len(order), -1)  # [G, slots·V]
    values, flat = cand.topk(min(2 * beam_width, cand.shape[1]), dim=-1)  # [G, k]
    slot = torch.div(flat, vocab, rounding_mode="floor")  # [G, k]
    return (safe.gather(1, slot).view(-1), (flat % vocab).view(-1), values.view(-1), order)


def fork(rows: list[Row], extensions: list[Choice]) -> list[tuple[int, Row]]:
    """(parent row index, child) per extension: the child has pushed its token, its matcher not
    yet consumed it. Every child but the last of a parent gets a deep copy of the matcher, taken
    before any child consumes its token."""
    children_left: dict[int, int] = {}
    for ext in extensions:
        children_left[ext.row] = children_left.get(ext.row, 0) + 1
    children = []
    for ext in extensions:
        parent = rows[ext.row]
        children_left[ext.row] -= 1
        last = children_left[ext.row] == 0
        child = parent.child(parent.matcher if last else parent.matcher.deep_copy())
        child.push(ext)
        children.append((ext.row, child))
    return children


def best_extensions(
    group: BeamGroup,
    choices: list[Choice],
    rows: list[Row],
    stop_token_id: int,
    generation: Callable[[Row, bool, bool], Generation],
) -> list[Choice]:
    """Walk one prompt's candidates best first: an end token among the best `width` closes an
    accepting row's hypothesis (added to `group.finished` via `generation`; elsewhere, or at a
    non-accepting row, it is dropped); the `width` best other extensions are returned."""
    extensions = []
    for position, choice in enumerate(choices):
        if choice.score == NEG_INF:
            break
        if choice.token == stop_token_id:
            if position < group.width and rows[choice.row].matcher.is_accepting():
                hyp = rows[choice.row].child(None)
                hyp.push(choice)
                insort(group, generation(hyp, True, False))
            continue
        extensions.append(choice)
        if len(extensions) == group.width:
            break
    return extensions


def step_group(
    group: BeamGroup,
    choices: list[Choice],
    rows: list[Row],
    outputs: Outputs,
    stop_token_id: int,
    max_new_tokens: int,
) -> list[tuple[int, Row]]:
    """One step of one prompt's beam: end-token candidates among the best B become finished
    hypotheses; the B best other extensions fork their parents' rows. Returns the rows that go
    on, each with the index of the row (cache slot) it continues; the group is closed into
    `outputs` when it is done."""
    extensions = best_extensions(group, choices, rows, stop_token_id, outputs.generation)
    finished, width = group.finished, group.width
    # Done when no live beam can still beat the width-th finished one (HF's heuristic: the
    # best live score at its current length).
    if (
        not extensions
        or len(finished) >= width
        and group.score(extensions[0].score, len(rows[extensions[0].row].tokens) + 1)
        <= rank(group, finished[width - 1])
    ):
        outputs.close_group(group, [])
        return []
    live = []
    for i, child in fork(rows, extensions):  # each child's token not yet consumed
        if not child.matcher.consume_token(child.tokens[-1]):
            log.warning("beam matcher error: %s", child.matcher.get_error())
            continue
        live.append((i, child))
    if not live:
        outputs.close_group(group, [])
        return []
    if len(live[0][1].tokens) >= max_new_tokens:  # all beams have the same length
        complete = [(i, c) for i, c in live if grammar_complete(c.matcher)]
        if not complete:
            outputs.close_group(group, [c for _, c in live])
            return []
        live = complete  # they take their forced end token in the next step
    return live
