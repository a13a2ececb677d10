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

Cost: one draw's forward token positions of generation and of the potential, in total and per
output (`grammarrl.evaluation.costs`), and the machine; with `search.greedy_baseline` (default)
the run first decodes the same examples greedily with the same decoder, and reports wall-time
and forward-token ratios of one draw against that pass.
Writes results.json and predictions.jsonl (schema in `grammarrl.runs.results`, plus the search fields
documented in docs/search.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.decoding.smc import ParticleSet
from grammarrl.evaluation.costs import Pass, cost_fields, counted
from grammarrl.evaluation.evaluate import (
    decode_examples,
    output_rewards,
    output_summary,
    run_scoring_job,
    save_results,
    score_test_sets,
)
from grammarrl.evaluation.settings import EvalSettings
from grammarrl.evaluation.test_sets import sets_summary, test_examples
from grammarrl.rl.reward import make_reward
from grammarrl.runs.results import adapter_name, build_results, dtype_name
from grammarrl.search.particles import search_examples
from grammarrl.search.potentials import Potential, make_potential
from grammarrl.search.resume import DrawProgress, remove_progress
from grammarrl.search.selections import (
    Selections,
    diagnostics,
    mean_over_draws,
    mean_records,
    selection_scores,
)
from grammarrl.search.settings import SearchSettings
from grammarrl.tasks.base import Task
from grammarrl.types import Example

log = logging.getLogger(__name__)


def run_search(cfg: DictConfig) -> dict[str, Any]:
    """mode=search: the task, the model (plus `eval.adapter` as the proposal if set), search."""
    settings = SearchSettings.from_config(cfg.search)
    return run_scoring_job(
        cfg,
        lambda evaluation, model, tokenizer, task, out: search(
            evaluation, settings, model, tokenizer, task, out, adapter=cfg.eval.adapter
        ),
    )


@dataclass(frozen=True)
class _Job:
    """What every draw of one search run shares: the settings, the model, the task and its
    test sets, the decoder and the potential."""

    evaluation: EvalSettings
    settings: SearchSettings
    model: torch.nn.Module
    tokenizer: Any
    task: Task
    decoder: ConstrainedDecoder
    potential: Potential
    test_sets: list[list[Example]]
    adapter: str | Path | None  # the proposal's adapter (None: the frozen base model)
    progress: bool
    out: Path  # the run directory: its search progress files (`grammarrl.search.resume`)


@dataclass
class _Draw:
    """One run of the method over every distinct test example with one sampler seed, scored."""

    sampler_seed: int
    populations: dict[str, ParticleSet]
    picks: Selections
    selected: dict[str, Generation]
    per_set: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    seconds: float
    potential_seconds: float
    search_tokens: int
    rewards: Pass  # the eval.score_rewards pass over the selected outputs

    @property
    def scores(self) -> list[float]:
        """The metric of each test set."""
        return [record["value"] for record in self.per_set]


def search(
    evaluation: EvalSettings,
    settings: SearchSettings,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    out: str | Path,
    name: str = "results",
    progress: bool = True,
    adapter: str | Path | None = None,
) -> dict[str, Any]:
    """Run the search method (`settings`) on the seeded test sets (`evaluation.test_sets`) once
    per sampler seed (`evaluation.sampler_seeds`), write `<out>/<name>.json` (per-draw scores
    and their mean per set) and the predictions (one row per draw, set and example); returns
    the results record (with `path`). `adapter` is recorded as the proposal's adapter (None:
    the frozen base model)."""
    potential = make_potential(
        settings.potential, task, make_reward(evaluation.reward, model, tokenizer, task)
    )
    test_sets = test_examples(evaluation.test_sets, task)[0]
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), evaluation.max_new_tokens)
    job = _Job(
        evaluation,
        settings,
        model,
        tokenizer,
        task,
        decoder,
        potential,
        test_sets,
        adapter,
        progress,
        Path(out),
    )
    greedy = None
    if settings.greedy_baseline:
        greedy = _greedy_baseline(
            decoder, tokenizer, task, test_sets, evaluation.batch_size, progress
        )
    draws = []
    for draw, sampler_seed in enumerate(evaluation.sampler_seeds):
        log.info("search: draw %d with sampler seed %d", draw, sampler_seed)
        draws.append(_draw(job, draw, sampler_seed))
        for row in draws[-1].rows:
            row.update(draw=draw, sampler_seed=sampler_seed)
    results = _results(job, draws, greedy)
    saved = save_results(Path(out), results, [row for d in draws for row in d.rows], name)
    remove_progress(out)
    return saved


def _results(job: _Job, draws: list[_Draw], greedy: dict[str, Any] | None) -> dict[str, Any]:
    """The results record of every draw: scores per set (mean over draws), costs, diagnostics."""
    evaluation, task, device = job.evaluation, job.task, str(job.decoder.device)
    potential_tokens = job.potential.forward_tokens // len(draws)
    seconds = sum(d.seconds for d in draws) / len(draws)  # one draw's cost
    potential_seconds = sum(d.potential_seconds for d in draws) / len(draws)
    search_tokens = sum(d.search_tokens for d in draws) // len(draws)
    rewards = Pass(
        sum(d.rewards.tokens for d in draws) // len(draws),
        sum(d.rewards.seconds for d in draws) / len(draws),
    )
    pooled = [g for d in draws for g in d.selected.values()]
    return build_results(
        task=task.name,
        model=evaluation.model,
        decoding=job.settings.method,
        metric=task.metric_name,
        scores=mean_over_draws([d.scores for d in draws]),
        config=evaluation.config,
        **output_summary(task, pooled, seconds * len(draws)),
        **_method_fields(job.settings),
        adapter=adapter_name(job.adapter),
        **_costs(seconds, potential_seconds, search_tokens, potential_tokens, greedy),
        sampler_seeds=[d.sampler_seed for d in draws],
        scores_per_draw=[d.scores for d in draws],
        diagnostics=diagnostics(
            [p for d in draws for p in d.populations.values()],
            pooled,
            mean_over_draws([d.picks.posterior_weighted for d in draws]),
        ),
        selections=selection_scores([d.picks for d in draws]),
        potential_seconds=potential_seconds,
        **cost_fields(len(draws[0].selected), search_tokens, rewards, device, potential_tokens),
        **sets_summary(
            evaluation.test_sets,
            evaluation.max_new_tokens,
            task,
            job.test_sets,
            len(draws[0].selected),
        ),
        device=device,
        dtype=dtype_name(job.model),
        per_set=[mean_records([d.per_set[i] for d in draws]) for i in range(len(job.test_sets))],
    )


def _draw(job: _Job, draw: int, sampler_seed: int) -> _Draw:
    """Particles of every distinct example drawn with `sampler_seed` (continuing the draw's
    progress file if a killed run left one), selected and scored (with the rewards of the
    selected outputs when `eval.score_rewards`)."""
    settings, task, decoder = job.settings, job.task, job.decoder
    all_examples = [ex for test_set in job.test_sets for ex in test_set]
    saved = DrawProgress(job.out, draw, sampler_seed, [ex.uid for ex in all_examples])
    tokens0, started = decoder.forward_tokens, time.perf_counter()
    populations, potential_seconds = search_examples(
        decoder,
        job.tokenizer,
        task,
        all_examples,
        job.potential,
        settings,
        sampler_seed,
        job.progress,
        saved,
    )
    seconds = saved.earlier_seconds + time.perf_counter() - started
    search_tokens = decoder.forward_tokens - tokens0
    picks = Selections(task, populations, settings.method, settings.posterior_draws, sampler_seed)
    selected = picks.selected()
    rewards, scoring = None, Pass()
    if job.evaluation.score_rewards:
        with counted(job.model) as scoring:
            rewards = output_rewards(
                job.evaluation.reward,
                job.model,
                job.tokenizer,
                task,
                all_examples,
                selected,
                job.progress,
            )
    _, per_set, rows = score_test_sets(
        task, job.test_sets, selected, rewards, picks.set_fields, picks.row_fields
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
        scoring,
    )


def _method_fields(settings: SearchSettings) -> dict[str, Any]:
    """The search settings a results file records (`ess_threshold` 0: no resampling)."""
    return {
        "method": settings.method,
        "particles": settings.particles,
        "potential": settings.potential,
        "ess_threshold": settings.ess_threshold,
        "temperature": settings.temperature,
        "batch_size": settings.batch_size,
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
