"""Picking one output per test example from its particles, and what a search results file
says about the picks: the method's selection and the others it reports on the same particles
(rerank <-> is), the posterior-weighted metric, per-set means over sampler draws, particle
diagnostics and the particle fields of a predictions row."""

from __future__ import annotations

import math
from typing import Any

from grammarrl.decoding import Generation
from grammarrl.decoding.smc import ParticleSet
from grammarrl.runs.results import mean_std
from grammarrl.search.methods import ess, normalized_weights, posterior_draws
from grammarrl.search.registry import search_method
from grammarrl.tasks.base import Task
from grammarrl.types import Example


def mean_over_draws(per_draw: list[list[float]]) -> list[float]:
    """Per test set, the mean of its values over the draws."""
    return [sum(values) / len(values) for values in zip(*per_draw)]


def mean_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One test set's record over the draws: every numeric field averaged, and each draw's own
    record under `per_draw`."""
    numeric = [
        k for k, v in records[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    mean = {k: sum(float(r[k]) for r in records) / len(records) for k in numeric}
    return {**mean, "size": records[0]["size"], "per_draw": records}


def selection_scores(picks: list[Selections]) -> dict[str, dict[str, Any]]:
    """Each selection's per-set metric: the mean over draws, each draw's, and the overall mean."""
    selections = {}
    for method in picks[0].scores:
        per_draw = [p.scores[method] for p in picks]
        scores = mean_over_draws(per_draw)
        selections[method] = {"scores": scores, "mean": mean_std(scores)[0], "per_draw": per_draw}
    return selections


class Selections:
    """Each output picked from the particles: the method's own selection, plus the others it
    reports on the same particles (`SearchMethod.selections`: rerank <-> is); per test set,
    every selection's metric and the posterior-weighted metric (`posterior_draws` draws); per
    example, every selection's score."""

    def __init__(
        self, task: Task, populations: dict[str, ParticleSet], method: str, draws: int, seed: int
    ):
        self.task, self.populations, self.method = task, populations, method
        self.draws, self.seed = draws, seed
        methods = search_method(method).reported()
        self.chosen = {
            m: {uid: search_method(m).select(ps) for uid, ps in populations.items()}
            for m in methods
        }
        self.scores: dict[str, list[float]] = {m: [] for m in methods}
        self.items: dict[tuple[int, str], dict[str, Any]] = {}  # (set, uid) -> method -> item
        self.posterior_weighted: list[float] = []

    def selected(self) -> dict[str, Generation]:
        return {
            uid: self.populations[uid].generations[i] for uid, i in self.chosen[self.method].items()
        }

    def set_fields(self, set_idx: int, test_set: list[Example]) -> dict[str, Any]:
        for method, chosen in self.chosen.items():
            texts = [self.populations[ex.uid].generations[chosen[ex.uid]].text for ex in test_set]
            result = self.task.score(texts, test_set)
            self.scores[method].append(result.value)
            for ex, item in zip(test_set, result.per_example):
                self.items.setdefault((set_idx, ex.uid), {})[method] = item
        weighted = float("nan")
        if self.draws:
            sampled = posterior_draws(
                [self.populations[ex.uid] for ex in test_set], self.draws, self.seed + set_idx
            )
            weighted = (
                sum(self.task.score([g.text for g in draw], test_set).value for draw in sampled)
                / self.draws
            )
        self.posterior_weighted.append(weighted)
        return {"posterior_weighted": weighted}

    def row_fields(self, set_idx: int, ex: Example, gen: Generation) -> dict[str, Any]:
        return {
            **particle_fields(
                gen,
                self.populations[ex.uid],
                self.chosen[self.method][ex.uid],
                {m: chosen[ex.uid] for m, chosen in self.chosen.items()},
            ),
            "selection_scores": self.items[(set_idx, ex.uid)],
        }


def diagnostics(
    pops: list[ParticleSet], selected: list[Generation], posterior_weighted: list[float]
) -> dict[str, Any]:
    """Particle statistics: ESS, completeness, vanished weights, resampling, diversity."""
    count = max(len(pops), 1)
    return {
        "mean_ess": sum(ess(p.log_weights) for p in pops) / count,
        "min_ess_during": _mean([min(p.ess_trace) for p in pops if p.ess_trace]),
        "complete_selected": sum(g.finished for g in selected) / max(len(selected), 1),
        "weights_vanished": sum(normalized_weights(p.log_weights) is None for p in pops) / count,
        "posterior_weighted": mean_std(posterior_weighted)[0],
        "posterior_weighted_scores": posterior_weighted,
        "resamples_per_prompt": sum(p.resamples for p in pops) / count,
        "complete_particles": sum(g.finished for p in pops for g in p.generations)
        / max(sum(len(p.generations) for p in pops), 1),
        "distinct_outputs_per_prompt": _mean([len({g.text for g in p.generations}) for p in pops]),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def particle_fields(
    gen: Generation, ps: ParticleSet, index: int, picks: dict[str, int]
) -> dict[str, Any]:
    """A predictions row's search fields: the selection, its posterior weight, the particles."""
    weights = normalized_weights(ps.log_weights)
    return {
        "selected": index,
        "selections": {m: ps.generations[i].text for m, i in picks.items()},
        "posterior_weight": sum(
            w
            for w, g in zip(weights, ps.generations)
            if (g.text, g.finished) == (gen.text, gen.finished)
        )
        if weights
        else None,
        "ess": ess(ps.log_weights),
        "vanished": weights is None,
        "resamples": ps.resamples,
        "particles": [
            {
                "text": g.text,
                "finished": g.finished,
                "log_weight": w if math.isfinite(w) else None,
                "potential": p if math.isfinite(p) else None,
                "logp_unconstrained": g.sum_logp_unconstrained,
                "num_tokens": g.num_tokens,
            }
            for g, w, p in zip(ps.generations, ps.log_weights, ps.potentials)
        ],
    }
