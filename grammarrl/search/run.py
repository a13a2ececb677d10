"""mode=search: Sample-Rerank, Full IS and Full SMC (paper appendix "Baselines and Inference-Time
Methods") on the seeded test sets, scored like mode=eval.

    python -m grammarrl.run mode=search search.method=rerank|is|smc search.particles=10 \
        [search.potential=reverse|task|none] [eval.adapter=PATH]

Each distinct test example is decoded once per sampler seed (`eval.sampler_seeds`, default three
independent draws on the same test sets; results keep every draw's scores, `scores` is their
mean per set): N particles from the grammar-constrained proposal
(`grammarrl.decoding.smc`), weighted by p/q (exact local-masking weights) times the expensive
potential, resampled when ESS < N/3 (smc only), then reduced to one output (posterior mode; the
potential's argmax for rerank). rerank and is draw the very same particles for the same seed
(paired, as in the paper), and each run also reports the other's selection on its particles.

Cost: with `search.greedy_baseline` (default) the run first decodes the same examples greedily
with the same decoder, and reports wall-time and forward-token ratios of one draw against that
pass.
Writes results.json and predictions.jsonl (schema in `grammarrl.runs.results`, plus the search fields
documented in docs/search.md).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.smc import ParticleSet, smc
from grammarrl.evaluation.evaluate import (
    decode_examples,
    distinct_prompts,
    output_rewards,
    output_summary,
    run_scoring_job,
    save_results,
    score_test_sets,
    sets_summary,
    test_examples,
)
from grammarrl.runs.results import adapter_name, build_results, dtype_name, mean_std
from grammarrl.runs.rundir import run_dir
from grammarrl.search.methods import SELECTORS, ess, normalized_weights, posterior_draws
from grammarrl.search.potentials import BoundPotential, Potential, default_potential, make_potential
from grammarrl.tasks.base import Task
from grammarrl.types import Example

log = logging.getLogger(__name__)


def run_search(cfg: DictConfig) -> dict[str, Any]:
    """mode=search: the task, the model (plus `eval.adapter` as the proposal if set), search."""
    return run_scoring_job(cfg, search)


class _Timed:
    """A bound potential that also measures the time spent in it (cost accounting)."""

    def __init__(self, bound: BoundPotential):
        self.bound = bound
        self.on_prefix = bound.on_prefix
        self.seconds = 0.0

    def prefix(self, prompt: int, text: str) -> float:
        start = time.perf_counter()
        try:
            return self.bound.prefix(prompt, text)
        finally:
            self.seconds += time.perf_counter() - start

    def complete(self, prompt: int, texts: list[str]) -> list[float]:
        start = time.perf_counter()
        try:
            return self.bound.complete(prompt, texts)
        finally:
            self.seconds += time.perf_counter() - start


def search_examples(
    decoder: ConstrainedDecoder,
    tokenizer: Any,
    task: Task,
    examples: list[Example],
    potential: Potential,
    settings: DictConfig,
    seed: int,
    progress: bool = True,
) -> tuple[dict[str, ParticleSet], float]:
    """Particles of each distinct example (by uid) under `settings` (the `search` config
    group), in length-sorted batches; also returns the seconds spent in the potential."""
    from tqdm.auto import tqdm

    method, particles, batch_size = (
        str(settings.method),
        int(settings.particles),
        int(settings.batch_size),
    )
    unique, prompts, order = distinct_prompts(tokenizer, task, examples)
    generator = torch.Generator().manual_seed(seed)
    resample_generator = torch.Generator().manual_seed(seed + 1)
    threshold = float(settings.ess_threshold) if method == "smc" else 0.0  # rerank, is: none
    populations: dict[str, ParticleSet] = {}
    potential_seconds = 0.0
    bar = tqdm(total=len(order), desc=f"search {method}", unit="ex", disable=not progress)
    for start in range(0, len(order), batch_size):
        uids = order[start : start + batch_size]
        twist = None
        if potential.name != "none":
            twist = _Timed(potential.bind([unique[uid] for uid in uids]))
        sets = smc(
            decoder,
            [prompts[uid] for uid in uids],
            particles,
            twist=twist,
            ess_threshold=threshold,
            temperature=float(settings.temperature),
            generator=generator,
            resample_generator=resample_generator,
        )
        if twist is not None:
            potential_seconds += twist.seconds
        populations.update(zip(uids, sets))
        bar.update(len(uids))
    bar.close()
    return populations, potential_seconds


@dataclass
class _Draw:
    """One run of the method over every distinct test example with one sampler seed, scored."""

    sampler_seed: int
    populations: dict[str, ParticleSet]
    picks: _Selections
    selected: dict[str, Generation]
    per_set: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    seconds: float
    potential_seconds: float
    search_tokens: int

    @property
    def scores(self) -> list[float]:
        """The metric of each test set."""
        return [record["value"] for record in self.per_set]


def search(
    cfg: DictConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    out: str | Path | None = None,
    name: str = "results",
    progress: bool = True,
) -> dict[str, Any]:
    """Run `cfg.search` on the seeded test sets (`cfg.eval.num_test_sets` x `test_size`) once
    per sampler seed (`cfg.eval.sampler_seeds`), write `<out>/<name>.json` (per-draw scores and
    their mean per set) and the predictions (one row per draw, set and example); returns the
    results record (with `path`)."""
    settings = cfg.search
    out = Path(out) if out is not None else run_dir(cfg)
    potential_name = str(settings.potential or default_potential(str(settings.method)))
    potential = make_potential(potential_name, task, model, tokenizer)
    test_sets = test_examples(cfg, task)[0]
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), cfg.task.max_new_tokens)
    greedy = None
    if settings.greedy_baseline:
        greedy = _greedy_baseline(
            decoder, tokenizer, task, test_sets, cfg.eval.batch_size, progress
        )
    draws = []
    for draw, sampler_seed in enumerate(int(seed) for seed in cfg.eval.sampler_seeds):
        log.info("search: draw %d with sampler seed %d", draw, sampler_seed)
        draws.append(
            _draw(
                cfg, model, tokenizer, task, decoder, potential, test_sets, sampler_seed, progress
            )
        )
        for row in draws[-1].rows:
            row.update(draw=draw, sampler_seed=sampler_seed)
    potential_tokens = potential.forward_tokens // len(draws)
    seconds = sum(d.seconds for d in draws) / len(draws)  # one draw's cost
    potential_seconds = sum(d.potential_seconds for d in draws) / len(draws)
    search_tokens = sum(d.search_tokens for d in draws) // len(draws)
    pooled = [g for d in draws for g in d.selected.values()]
    results = build_results(
        task=task.name,
        model=cfg.model.name,
        decoding=str(settings.method),
        metric=task.metric_name,
        scores=_mean_over_draws([d.scores for d in draws]),
        config=cfg,
        **output_summary(task, pooled, seconds * len(draws)),
        **_method_fields(settings, potential_name),
        adapter=adapter_name(cfg.eval.adapter),
        **_costs(seconds, potential_seconds, search_tokens, potential_tokens, greedy),
        sampler_seeds=[d.sampler_seed for d in draws],
        scores_per_draw=[d.scores for d in draws],
        diagnostics=_diagnostics(
            [p for d in draws for p in d.populations.values()],
            pooled,
            _mean_over_draws([d.picks.posterior_weighted for d in draws]),
        ),
        selections=_selection_scores([d.picks for d in draws]),
        potential_seconds=potential_seconds,
        forward_tokens=search_tokens,
        potential_forward_tokens=potential_tokens,
        **sets_summary(cfg, task, test_sets, len(draws[0].selected)),
        device=str(decoder.device),
        dtype=dtype_name(model),
        per_set=[_mean_records([d.per_set[i] for d in draws]) for i in range(len(test_sets))],
    )
    return save_results(out, results, [row for d in draws for row in d.rows], name)


def _draw(
    cfg: DictConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    decoder: ConstrainedDecoder,
    potential: Potential,
    test_sets: list[list[Example]],
    sampler_seed: int,
    progress: bool,
) -> _Draw:
    """Particles of every distinct example drawn with `sampler_seed`, selected and scored."""
    settings = cfg.search
    all_examples = [ex for test_set in test_sets for ex in test_set]
    tokens0, started = decoder.forward_tokens, time.perf_counter()
    populations, potential_seconds = search_examples(
        decoder, tokenizer, task, all_examples, potential, settings, sampler_seed, progress
    )
    seconds = time.perf_counter() - started
    search_tokens = decoder.forward_tokens - tokens0
    picks = _Selections(
        task, populations, str(settings.method), int(settings.posterior_draws), sampler_seed
    )
    selected = picks.selected()
    rewards = None
    if cfg.eval.score_rewards:
        rewards = output_rewards(model, tokenizer, task, all_examples, selected, progress)
    _, per_set, rows = score_test_sets(
        task, test_sets, selected, rewards, picks.set_fields, picks.row_fields
    )
    return _Draw(
        sampler_seed,
        populations,
        picks,
        selected,
        per_set,
        rows,
        seconds,
        potential_seconds,
        search_tokens,
    )


def _mean_over_draws(per_draw: list[list[float]]) -> list[float]:
    """Per test set, the mean of its values over the draws."""
    return [sum(values) / len(values) for values in zip(*per_draw)]


def _mean_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One test set's record over the draws: every numeric field averaged, and each draw's own
    record under `per_draw`."""
    numeric = [
        k for k, v in records[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    mean = {k: sum(float(r[k]) for r in records) / len(records) for k in numeric}
    return {**mean, "size": records[0]["size"], "per_draw": records}


def _selection_scores(picks: list[_Selections]) -> dict[str, dict[str, Any]]:
    """Each selection's per-set metric: the mean over draws, each draw's, and the overall mean."""
    selections = {}
    for method in picks[0].scores:
        per_draw = [p.scores[method] for p in picks]
        scores = _mean_over_draws(per_draw)
        selections[method] = {"scores": scores, "mean": mean_std(scores)[0], "per_draw": per_draw}
    return selections


def _method_fields(settings: DictConfig, potential: str) -> dict[str, Any]:
    """The search settings a results file records (`ess_threshold` 0: no resampling)."""
    method = str(settings.method)
    return {
        "method": method,
        "particles": int(settings.particles),
        "potential": potential,
        "ess_threshold": float(settings.ess_threshold) if method == "smc" else 0.0,
        "temperature": float(settings.temperature),
        "batch_size": int(settings.batch_size),
    }


class _Selections:
    """Each output picked from the particles: the method's own selection, plus the paired one on
    the same particles (rerank <-> is); per test set, every selection's metric and the
    posterior-weighted metric (`posterior_draws` draws); per example, every selection's score."""

    def __init__(
        self, task: Task, populations: dict[str, ParticleSet], method: str, draws: int, seed: int
    ):
        self.task, self.populations, self.method = task, populations, method
        self.draws, self.seed = draws, seed
        methods = ["rerank", "is"] if method in ("rerank", "is") else [method]
        self.chosen = {
            m: {uid: SELECTORS[m](ps) for uid, ps in populations.items()} for m in methods
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
            **_particle_fields(
                gen,
                self.populations[ex.uid],
                self.chosen[self.method][ex.uid],
                {m: chosen[ex.uid] for m, chosen in self.chosen.items()},
            ),
            "selection_scores": self.items[(set_idx, ex.uid)],
        }


def _greedy_baseline(
    decoder: ConstrainedDecoder,
    tokenizer: Any,
    task: Task,
    test_sets: list[list[Example]],
    batch_size: int,
    progress: bool,
) -> dict[str, Any]:
    """Greedy decoding of the same examples with the same decoder: the cost reference."""
    tokens0, started = decoder.forward_tokens, time.perf_counter()
    examples = [ex for test_set in test_sets for ex in test_set]
    outputs = decode_examples(decoder, tokenizer, task, examples, "greedy", 0, batch_size, progress)
    return {
        "seconds": time.perf_counter() - started,
        "forward_tokens": decoder.forward_tokens - tokens0,
        "scores": [task.score([outputs[ex.uid].text for ex in ts], ts).value for ts in test_sets],
    }


def _costs(
    seconds: float,
    potential_seconds: float,
    search_tokens: int,
    potential_tokens: int,
    greedy: dict[str, Any] | None,
) -> dict[str, Any]:
    """Wall-time and forward-token ratios against the greedy pass ({} without one)."""
    if greedy is None:
        return {}
    timed = greedy["seconds"] > 0
    return {
        "cost": seconds / greedy["seconds"] if timed else None,
        "cost_generation": (seconds - potential_seconds) / greedy["seconds"] if timed else None,
        "cost_tokens": (search_tokens + potential_tokens) / max(greedy["forward_tokens"], 1),
        "cost_tokens_generation": search_tokens / max(greedy["forward_tokens"], 1),
        "greedy_baseline": greedy,
    }


def _diagnostics(
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


def _particle_fields(
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
