"""Beam search's parts: a prompt's group of finished hypotheses (ranked best first), the best
extensions of its beams at a step, and forking the rows that continue them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from grammarrl.decoding.rows import BEAM, NEG_INF, Row, StepDistribution
from grammarrl.decoding.types import BeamResult, Generation


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


def fork(rows: list[Row], extensions: list[tuple]) -> list[tuple[int, Row]]:
    """(parent row index, child) per extension (parent row index, token, logp_u, logp_c, mass,
    score): the child has pushed its token, its matcher not yet consumed it. Every child but the
    last of a parent gets a deep copy of the matcher, taken before any child consumes its token."""
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
    return children


def best_extensions(
    group: BeamGroup,
    entries: list[list[float]],
    rows: list[Row],
    stop_token_id: int,
    generation: Callable[[Row, bool, bool], Generation],
) -> list[tuple[int, int, float, float, float, float]]:
    """Walk one prompt's candidates best first: an end token among the best `width` closes an
    accepting row's hypothesis (added to `group.finished` via `generation`; elsewhere, or at a
    non-accepting row, it is dropped); the `width` best other extensions are returned as
    (parent row index, token, logp_u, logp_c, mass, score)."""
    extensions = []
    for position, (i, t, logp_u, logp_c, mass, value) in enumerate(entries):
        if value == NEG_INF:
            break
        i, t = int(i), int(t)
        if t == stop_token_id:
            if position < group.width and rows[i].matcher.is_accepting():
                hyp = rows[i].child(None)
                hyp.push(t, logp_u, logp_c, mass)
                insort(group, generation(hyp, True, False))
            continue
        extensions.append((i, t, logp_u, logp_c, mass, value))
        if len(extensions) == group.width:
            break
    return extensions
