"""What reranking a candidate group by the reward would pick, and what it would score: the
metric of greedy, of the best candidate per group (oracle) and of the reward's argmax per λ;
how full the argmax is against greedy (`fullness`); without gold outputs, the reward gap between
the argmax and greedy and how often they differ. Pure functions of scored groups
(`candidates.Group`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.fullness import floor, fullness_unit, gold_fullness, mean_fullness
from grammarrl.rl.rloo import combine_rewards
from grammarrl.tasks.base import Task


@dataclass(frozen=True)
class Sigmas:
    """The reward's scales, as training uses them, and where they came from."""

    direct: float
    reverse: float
    source: str = ""


def combined_values(
    direct: list[float], reverse: list[float], lam: float, sigmas: Sigmas
) -> list[float]:
    """The combined reward (1-λ)·R_direct/σ_d + λ·R_reverse/σ_r of each (R_direct, R_reverse),
    as training combines them (`rloo.combine_rewards`); -inf where a reward is NaN."""
    value = combine_rewards(
        torch.tensor(direct, dtype=torch.float64),
        torch.tensor(reverse, dtype=torch.float64),
        lam,
        sigmas.direct,
        sigmas.reverse,
    )
    return [-math.inf if math.isnan(v) else v for v in value.tolist()]


def combined(group: Group, lam: float, sigmas: Sigmas) -> list[float]:
    """Each candidate's combined reward; -inf for an empty candidate."""
    return combined_values(group.direct, group.reverse, lam, sigmas)


def first_max(values: Sequence[Any]) -> int:
    """Index of the largest value, the first on ties (the greedy output comes first)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def argmax_index(group: Group, lam: float, sigmas: Sigmas) -> int:
    """The candidate the combined reward prefers (ties: the earlier one)."""
    return first_max(combined(group, lam, sigmas))


def example_scores(task: Task, group: Group) -> list[tuple[float, ...]]:
    """Each candidate's rank on its own input: its metric (-inf where NaN), then, where the task
    counts them, more true positives, fewer false positives, fewer misses. Per-input F1 is 0 for
    every candidate of an input without gold entities; the counts still tell a candidate that
    invents none from one that invents some, as the corpus micro-F1 does."""
    keys = []
    for text in group.texts:
        scores = task.score([text], [group.example])
        counts = scores.per_example[0] if scores.per_example else {}
        value = scores.value if not math.isnan(scores.value) else -math.inf
        keys.append((value, counts.get("tp", 0), -counts.get("fp", 0), -counts.get("fn", 0)))
    return keys


def oracle_index(task: Task, group: Group) -> int:
    """The candidate ranked best on its own input (`example_scores`; ties: the earlier one)."""
    return first_max(example_scores(task, group))


def metric_of(task: Task, groups: list[Group], picks: list[int]) -> dict[str, Any]:
    """The task metric of the picked candidates over the groups with gold outputs, and the
    per-field F1's the task's score details hold (json fields, CoNLL's types)."""
    labelled = [(g, i) for g, i in zip(groups, picks) if g.example.target]
    if not labelled:
        return {"value": None, "fields": {}}
    scores = task.score([g.texts[i] for g, i in labelled], [g.example for g, _ in labelled])
    fields = {
        name: detail["f1"]
        for name, detail in scores.details.items()
        if isinstance(detail, dict) and "f1" in detail
    }
    return {"value": scores.value, "fields": fields}


def reward_gap(groups: list[Group], picks: list[int], lam: float, sigmas: Sigmas) -> float | None:
    """Mean over the groups whose greedy output is valid of the combined reward of the pick
    minus greedy's (in σ units); None without such a group."""
    gaps = []
    for group, pick in zip(groups, picks):
        if group.valid[0]:
            values = combined(group, lam, sigmas)
            gaps.append(values[pick] - values[0])
    return sum(gaps) / len(gaps) if gaps else None


def distinct_share(groups: list[Group]) -> float:
    """The share of groups with at least two distinct valid candidates (something to rerank)."""
    if not groups:
        return math.nan
    distinct = [len({t for t, ok in zip(g.texts, g.valid) if ok}) >= 2 for g in groups]
    return sum(distinct) / len(groups)


def lambda_curve(
    task: Task,
    groups: list[Group],
    lambdas: Sequence[float],
    sigmas: Sigmas,
    labelled_golds: Sequence[str] = (),
) -> dict[str, Any]:
    """Greedy, oracle and the reward's argmax at each λ: the metric (None without gold), its
    per-field F1's, the mean fullness over every input (`fullness_unit`; the argmax's `emptier`:
    below `fullness.floor` of greedy's and the gold outputs', those of the dev inputs, else
    `labelled_golds`), how often the argmax is not greedy's output, and the reward gap."""
    greedy = [0] * len(groups)
    full = mean_fullness(groups, greedy)
    dev_gold = gold_fullness([g.example.target for g in groups])
    gold = dev_gold if dev_gold is not None else gold_fullness(labelled_golds)
    lowest = floor(full, gold)
    curve = []
    for lam in lambdas:
        picks = [argmax_index(g, lam, sigmas) for g in groups]
        fullness = mean_fullness(groups, picks)
        curve.append(
            {
                "lambda": lam,
                "metric": metric_of(task, groups, picks),
                "fullness": fullness,
                "emptier": fullness is not None and lowest is not None and fullness < lowest,
                "changed": sum(g.texts[p] != g.texts[0] for g, p in zip(groups, picks))
                / max(len(groups), 1),
                "reward_gap": reward_gap(groups, picks, lam, sigmas),
            }
        )
    return {
        "inputs": len(groups),
        "labelled": sum(bool(g.example.target) for g in groups),
        "candidates_per_input": len(groups[0].texts) if groups else 0,
        "valid_candidates": sum(sum(g.valid) for g in groups)
        / max(sum(len(g.texts) for g in groups), 1),
        "finished_candidates": sum(sum(g.finished) for g in groups)
        / max(sum(len(g.texts) for g in groups), 1),
        "distinct_share": distinct_share(groups),
        "fullness_unit": fullness_unit(groups),
        "greedy": {**metric_of(task, groups, greedy), "fullness": full},
        "gold_fullness": {
            "value": gold,
            "of": None
            if gold is None
            else "dev inputs"
            if dev_gold is not None
            else "labelled rows",
        },
        "oracle": metric_of(task, groups, [oracle_index(task, g) for g in groups])
        if any(g.example.target for g in groups)
        else {"value": None, "fields": {}},
        "argmax": curve,
    }
