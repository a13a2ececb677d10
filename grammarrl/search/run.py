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

from grammarrl.chat import encode_prompt
from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.smc import ParticleSet, smc
from grammarrl.evaluate import (
    decode_examples,
    is_valid,
    load_evaluated_model,
    output_rewards,
    reward_fields,
    reward_means,
)
from grammarrl.results import adapter_name, build_results, mean_std, run_dir, write_results
from grammarrl.search.methods import SELECTORS, ess, normalized_weights, posterior_draws
from grammarrl.search.potentials import BoundPotential, Potential, default_potential, make_potential
from grammarrl.tasks.base import Task
from grammarrl.types import Example

log = logging.getLogger(__name__)


def run_search(cfg: DictConfig) -> dict[str, Any]:
    """Load the task, the model (plus `eval.adapter` as the proposal if set), search, write."""
    from grammarrl.tasks import load_task

    out = run_dir(cfg)
    task = load_task(cfg)
    model, tokenizer = load_evaluated_model(cfg)
    results = search(cfg, model, tokenizer, task, out)
    print(summary_line(results))
    return results


def summary_line(results: dict[str, Any]) -> str:
    d = results["diagnostics"]
    cost = results.get("cost")
    cost_text = f"cost {cost:.1f}x greedy (tokens {results['cost_tokens']:.1f}x)" if cost else ""
    return (
        f"{results['task']} {results['model']} {results['decoding']}(N={results['particles']}, "
        f"{results['potential']}): {results['metric']} {results['mean']:.4f} ± "
        f"{results['std']:.4f} over {len(results['scores'])} test set(s) "
        f"{[round(s, 4) for s in results['scores']]}; validity {results['validity']:.3f}; "
        f"mean ESS {d['mean_ess']:.2f}, complete {d['complete_selected']:.3f}, vanished "
        f"{d['weights_vanished']:.3f}, posterior-weighted {d['posterior_weighted']:.4f}; "
        f"{cost_text} -> {results['path']}"
    )


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
    method: str,
    particles: int,
    ess_threshold: float,
    temperature: float,
    batch_size: int,
    seed: int,
    progress: bool = True,
) -> tuple[dict[str, ParticleSet], float]:
    """Particles of each distinct example (by uid), in length-sorted batches; also returns the
    seconds spent in the potential."""
    from tqdm.auto import tqdm

    unique: dict[str, Example] = {}
    for ex in examples:
        unique.setdefault(ex.uid, ex)
    prompts = {
        uid: encode_prompt(tokenizer, task.forward_messages(ex)) for uid, ex in unique.items()
    }
    order = sorted(unique, key=lambda uid: -len(prompts[uid]))
    generator = torch.Generator().manual_seed(seed)
    resample_generator = torch.Generator().manual_seed(seed + 1)
    threshold = ess_threshold if method == "smc" else 0.0  # rerank / is: no resampling
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
            temperature=temperature,
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
    s = cfg.search
    out = Path(out) if out is not None else run_dir(cfg)
    method = str(s.method)
    potential_name = str(s.potential or default_potential(method))
    potential = make_potential(potential_name, task, model, tokenizer)
    test_sets = task.test_sets(cfg.eval.num_test_sets, cfg.eval.test_size, cfg.seed)
    all_examples = [ex for test_set in test_sets for ex in test_set]
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), cfg.task.max_new_tokens)

    greedy = None
    if s.greedy_baseline:
        tokens0, started = decoder.forward_tokens, time.perf_counter()
        outputs = decode_examples(
            decoder, tokenizer, task, all_examples, "greedy", 0, cfg.eval.batch_size, progress
        )
        greedy = {
            "seconds": time.perf_counter() - started,
            "forward_tokens": decoder.forward_tokens - tokens0,
            "scores": [
                task.score([outputs[ex.uid].text for ex in ts], ts).value for ts in test_sets
            ],
        }

    tokens0, started = decoder.forward_tokens, time.perf_counter()
    populations, potential_seconds = search_examples(
        decoder,
        tokenizer,
        task,
        all_examples,
        potential,
        method,
        int(s.particles),
        float(s.ess_threshold),
        float(s.temperature),
        int(s.batch_size),
        int(cfg.seed),
        progress,
    )
    seconds = time.perf_counter() - started
    search_tokens = decoder.forward_tokens - tokens0
    potential_tokens = potential.forward_tokens

    # Selections: the method's own, plus the paired one on the same particles (rerank <-> is).
    selectors = ["rerank", "is"] if method in ("rerank", "is") else [method]
    chosen = {m: {uid: SELECTORS[m](ps) for uid, ps in populations.items()} for m in selectors}
    selected = {uid: populations[uid].generations[i] for uid, i in chosen[method].items()}

    rewards = (output_rewards(model, tokenizer, task, all_examples, selected, progress)
               if cfg.eval.score_rewards else None)
    draws = int(s.posterior_draws)
    scores, per_set, rows, selections = [], [], [], {m: [] for m in selectors}
    posterior_weighted = []
    for set_idx, test_set in enumerate(test_sets):
        gens = [selected[ex.uid] for ex in test_set]
        result = task.score([g.text for g in gens], test_set)
        scores.append(result.value)
        for m in selectors:
            texts = [populations[ex.uid].generations[chosen[m][ex.uid]].text for ex in test_set]
            selections[m].append(task.score(texts, test_set).value)
        pw = float("nan")
        if draws:
            sampled = posterior_draws(
                [populations[ex.uid] for ex in test_set], draws, cfg.seed + set_idx
            )
            pw = sum(task.score([g.text for g in d], test_set).value for d in sampled) / draws
        posterior_weighted.append(pw)
        per_set.append(
            {
                "value": result.value,
                "size": len(test_set),
                "validity": sum(is_valid(task, g) for g in gens) / len(gens),
                "truncated": sum(g.truncated for g in gens) / len(gens),
                "task_validity": result.validity,
                "posterior_weighted": pw,
                "details": result.details,
                **(reward_means(rewards, test_set) if rewards is not None else {}),
            }
        )
        for ex, gen, item in zip(test_set, gens, result.per_example):
            rows.append(
                _prediction_row(
                    set_idx,
                    ex,
                    gen,
                    item,
                    is_valid(task, gen),
                    populations[ex.uid],
                    chosen[method][ex.uid],
                    {m: chosen[m][ex.uid] for m in selectors},
                ) | reward_fields(rewards, ex.uid)
            )

    unique = list(selected.values())
    pops = list(populations.values())
    n_unique = max(len(unique), 1)
    diagnostics = {
        "mean_ess": sum(ess(p.log_weights) for p in pops) / max(len(pops), 1),
        "min_ess_during": _mean([min(p.ess_trace) for p in pops if p.ess_trace]),
        "complete_selected": sum(g.finished for g in unique) / n_unique,
        "weights_vanished": sum(normalized_weights(p.log_weights) is None for p in pops)
        / max(len(pops), 1),
        "posterior_weighted": mean_std(posterior_weighted)[0],
        "posterior_weighted_scores": posterior_weighted,
        "resamples_per_prompt": sum(p.resamples for p in pops) / max(len(pops), 1),
        "complete_particles": sum(g.finished for p in pops for g in p.generations)
        / max(sum(len(p.generations) for p in pops), 1),
        "distinct_outputs_per_prompt": _mean([len({g.text for g in p.generations}) for p in pops]),
    }
    extra: dict[str, Any] = {}
    if greedy is not None:
        extra = {
            "cost": seconds / greedy["seconds"] if greedy["seconds"] > 0 else None,
            "cost_generation": (seconds - potential_seconds) / greedy["seconds"]
            if greedy["seconds"] > 0
            else None,
            "cost_tokens": (search_tokens + potential_tokens) / max(greedy["forward_tokens"], 1),
            "cost_tokens_generation": search_tokens / max(greedy["forward_tokens"], 1),
            "greedy_baseline": greedy,
        }
    results = build_results(
        task=task.name,
        model=cfg.model.name,
        decoding=method,
        metric=task.metric_name,
        scores=scores,
        validity=sum(is_valid(task, g) for g in unique) / n_unique,
        truncated=sum(g.truncated for g in unique) / n_unique,
        examples_per_second=len(unique) / seconds if seconds > 0 else float("nan"),
        config=cfg,
        method=method,
        particles=int(s.particles),
        potential=potential_name,
        ess_threshold=float(s.ess_threshold) if method == "smc" else 0.0,
        temperature=float(s.temperature),
        adapter=adapter_name(cfg.eval.adapter),
        **extra,
        diagnostics=diagnostics,
        selections={m: {"scores": v, "mean": mean_std(v)[0]} for m, v in selections.items()},
        seconds_per_example=seconds / n_unique,
        decode_seconds=seconds,
        potential_seconds=potential_seconds,
        forward_tokens=search_tokens,
        potential_forward_tokens=potential_tokens,
        num_test_sets=len(test_sets),
        test_size=len(test_sets[0]) if test_sets else 0,
        num_examples=len(all_examples),
        num_unique_examples=len(unique),
        batch_size=int(s.batch_size),
        max_new_tokens=cfg.task.max_new_tokens,
        seed=cfg.seed,
        device=str(decoder.device),
        mean_output_tokens=sum(g.num_tokens for g in unique) / n_unique,
        per_set=per_set,
    )
    path = write_results(out, results, rows, name=name)
    results["path"] = str(path)
    log.info("wrote %s", path)
    return results


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _prediction_row(
    set_idx,
    ex,
    gen: Generation,
    item,
    valid: bool,
    ps: ParticleSet,
    index: int,
    picks: dict[str, int],
) -> dict[str, Any]:
    weights = normalized_weights(ps.log_weights)
    return {
        "set": set_idx,
        "uid": ex.uid,
        "input": ex.input,
        "gold": ex.target,
        "prediction": gen.text,
        "valid": valid,
        "finished": gen.finished,
        "truncated": gen.truncated,
        "num_tokens": gen.num_tokens,
        "logp_constrained": gen.sum_logp_constrained,
        "logp_unconstrained": gen.sum_logp_unconstrained,
        "scores": item,
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
