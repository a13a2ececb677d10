"""mode=search: Sample-Rerank, Full IS and Full SMC (paper appendix "Baselines and Inference-Time
Methods") on the seeded test sets, scored like mode=eval.

    python -m grammarrl.run mode=search search.method=rerank|is|smc search.particles=10 \
        [search.potential=reverse|task|none] [eval.adapter=PATH]

Each distinct test example is decoded once: N particles from the grammar-constrained proposal
(`grammarrl.decoding.smc`), weighted by p/q (exact local-masking weights) times the expensive
potential, resampled when ESS < N/3 (smc only), then reduced to one output (posterior mode; the
potential's argmax for rerank). rerank and is draw the very same particles for the same seed
(paired, as in the paper), and each run also reports the other's selection on its particles.

Cost: with `search.greedy_baseline` (default) the run first decodes the same examples greedily
with the same decoder, and reports wall-time and forward-token ratios against that pass.
Writes results.json and predictions.jsonl (schema in `grammarrl.results`, plus the search fields
documented in docs/search.md).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.smc import ParticleSet, smc
from grammarrl.evaluate import (
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
from grammarrl.results import adapter_name, build_results, dtype_name, mean_std
from grammarrl.rundir import run_dir
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


def search(
    cfg: DictConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    out: str | Path | None = None,
    name: str = "results",
    progress: bool = True,
) -> dict[str, Any]:
    """Run `cfg.search` on the seeded test sets (`cfg.eval.num_test_sets` x `test_size`), write
    `<out>/<name>.json` and the predictions; returns the results record (with `path`)."""
    settings = cfg.search
    out = Path(out) if out is not None else run_dir(cfg)
    method = str(settings.method)
    potential_name = str(settings.potential or default_potential(method))
    potential = make_potential(potential_name, task, model, tokenizer)
    test_sets, all_examples = test_examples(cfg, task)
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), cfg.task.max_new_tokens)
    greedy = None
    if settings.greedy_baseline:
        greedy = _greedy_baseline(
            decoder, tokenizer, task, test_sets, cfg.eval.batch_size, progress
        )
    tokens0, started = decoder.forward_tokens, time.perf_counter()
    populations, potential_seconds = search_examples(
        decoder, tokenizer, task, all_examples, potential, settings, int(cfg.seed), progress
    )
    seconds = time.perf_counter() - started
    search_tokens = decoder.forward_tokens - tokens0
    potential_tokens = potential.forward_tokens
    picks = _Selections(task, populations, method, int(settings.posterior_draws), int(cfg.seed))
    selected = picks.selected()
    rewards = None
    if cfg.eval.score_rewards:
        rewards = output_rewards(model, tokenizer, task, all_examples, selected, progress)
    scores, per_set, rows = score_test_sets(
        task, test_sets, selected, rewards, picks.set_fields, picks.row_fields
    )
    unique = list(selected.values())
    results = build_results(
        task=task.name,
        model=cfg.model.name,
        decoding=method,
        metric=task.metric_name,
        scores=scores,
        config=cfg,
        **output_summary(task, unique, seconds),
        **_method_fields(settings, potential_name),
        adapter=adapter_name(cfg.eval.adapter),
        **_costs(seconds, potential_seconds, search_tokens, potential_tokens, greedy),
        diagnostics=_diagnostics(list(populations.values()), unique, picks.posterior_weighted),
        selections={m: {"scores": v, "mean": mean_std(v)[0]} for m, v in picks.scores.items()},
        potential_seconds=potential_seconds,
        forward_tokens=search_tokens,
        potential_forward_tokens=potential_tokens,
        **sets_summary(cfg, test_sets, len(unique)),
        device=str(decoder.device),
        dtype=dtype_name(model),
        per_set=per_set,
    )
    return save_results(out, results, rows, name)


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
    posterior-weighted metric (`posterior_draws` draws)."""

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
        self.posterior_weighted: list[float] = []

    def selected(self) -> dict[str, Generation]:
        return {
            uid: self.populations[uid].generations[i] for uid, i in self.chosen[self.method].items()
        }

    def set_fields(self, set_idx: int, test_set: list[Example]) -> dict[str, Any]:
        for method, chosen in self.chosen.items():
            texts = [self.populations[ex.uid].generations[chosen[ex.uid]].text for ex in test_set]
            self.scores[method].append(self.task.score(texts, test_set).value)
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
        return _particle_fields(
            gen,
            self.populations[ex.uid],
            self.chosen[self.method][ex.uid],
            {m: chosen[ex.uid] for m, chosen in self.chosen.items()},
        )


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
