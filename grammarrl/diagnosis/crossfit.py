"""The lift of reranking, cross-fitted: λ is chosen on one half of the labelled dev inputs and
the lift measured on the other half, then the halves swap, so that no input both chooses λ and
measures it. The 95% interval resamples the inputs (paired: one resample scores both the picks
and greedy), `diagnose.bootstrap_draws` times with a fixed seed. Pure functions of scored
groups (`candidates.Group`)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grammarrl.diagnosis.candidates import Group
from grammarrl.diagnosis.selection import Sigmas, argmax_index, metric_of
from grammarrl.tasks.base import Task

BOOTSTRAP_SEED = 0  # fixed: diagnoses at other sampler seeds differ by their samples alone


@dataclass(frozen=True)
class CrossFit:
    """The cross-fitted lift: `lambdas` are the λ chosen on the first half (inputs 1, 3, 5, …
    of the labelled ones; applied to the second) and on the second (2, 4, 6, …; applied to the
    first); `greedy` and `picked` the metric over all of them."""

    lambdas: tuple[float, float]
    inputs: int
    greedy: float
    picked: float
    lift: float
    interval: tuple[float, float]
    draws: int


def rank_key(
    metric_at: Callable[[float], float], tiebreak: Callable[[float], float]
) -> Callable[[float], tuple[float, float, float]]:
    """What ranks λ's with gold outputs: the argmax's metric; ties: the higher `tiebreak` (the
    share of gold-preferred perturbation pairs), then the smaller λ."""
    return lambda lam: (metric_at(lam), tiebreak(lam), -lam)


def lift_interval(
    task: Task, groups: list[Group], picks: list[int], draws: int, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """The 95% bootstrap interval of the metric of `picks` minus greedy's over groups with gold
    outputs, the groups resampled `draws` times (paired: the same resample scores both)."""
    rng = random.Random(seed)
    lifts = []
    for _ in range(draws):
        sample = [rng.randrange(len(groups)) for _ in groups]
        examples = [groups[k].example for k in sample]
        picked = task.score([groups[k].texts[picks[k]] for k in sample], examples).value
        greedy = task.score([groups[k].texts[0] for k in sample], examples).value
        lifts.append(picked - greedy)
    lifts.sort()
    return lifts[int(0.025 * draws)], lifts[math.ceil(0.975 * draws) - 1]


def _chosen_on(
    task: Task,
    half: list[Group],
    lambdas: Sequence[float],
    sigmas: Sigmas,
    tiebreak: Callable[[float], float],
) -> float:
    def metric_at(lam: float) -> float:
        return metric_of(task, half, [argmax_index(g, lam, sigmas) for g in half])["value"]

    return max(lambdas, key=rank_key(metric_at, tiebreak))


def cross_fit(
    task: Task,
    groups: list[Group],
    lambdas: Sequence[float],
    sigmas: Sigmas,
    tiebreak: Callable[[float], float],
    draws: int,
) -> CrossFit | None:
    """The cross-fitted lift of the labelled groups (module docstring); None with fewer than
    two (no half to measure on)."""
    labelled = [g for g in groups if g.example.target]
    first, second = labelled[0::2], labelled[1::2]
    if not second:
        return None
    on_first = _chosen_on(task, first, lambdas, sigmas, tiebreak)
    on_second = _chosen_on(task, second, lambdas, sigmas, tiebreak)
    ordered = first + second
    picks = [argmax_index(g, on_second, sigmas) for g in first]
    picks += [argmax_index(g, on_first, sigmas) for g in second]
    greedy = metric_of(task, ordered, [0] * len(ordered))["value"]
    picked = metric_of(task, ordered, picks)["value"]
    return CrossFit(
        (on_first, on_second),
        len(ordered),
        greedy,
        picked,
        picked - greedy,
        lift_interval(task, ordered, picks, draws),
        draws,
    )
