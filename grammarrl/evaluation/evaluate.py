"""mode=eval: constrained greedy or beam decoding of the base model (or a trained adapter) on the
seeded test sets, scored with the task metric.

Distinct examples shared by several test sets are decoded once (predictions cached by uid), in
batches of `eval.batch_size` prompts sorted by length. Writes `results.json` and
`predictions.jsonl` into the run directory (schema in `grammarrl.runs.results`), with the cost
of the pass: forward token positions per output, wall seconds, the machine
(`grammarrl.evaluation.costs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.decoding import ConstrainedDecoder, Generation
from grammarrl.evaluation.costs import Pass, cost_fields, counted
from grammarrl.evaluation.settings import EvalSettings
from grammarrl.evaluation.test_sets import check_gold, sets_summary, test_examples
from grammarrl.models.chat import encode_prompt
from grammarrl.runs.results import adapter_name, build_results, dtype_name, write_results
from grammarrl.runs.rundir import run_dir
from grammarrl.tasks.base import Task
from grammarrl.types import Example

log = logging.getLogger(__name__)


def load_evaluated_model(
    model_cfg: DictConfig, cache_dir: str | Path, device: str, adapter: str | Path | None
) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) that mode=eval, mode=search and mode=export use: the base model
    (`model_cfg`, the config's `model` group), with `adapter` (`eval.adapter`) attached when
    set, in eval mode."""
    from grammarrl.models.loading import load_adapter, load_model

    model, tokenizer = load_model(model_cfg, cache_dir, device)
    if adapter:
        model = load_adapter(model, adapter)
    model.eval()
    return model, tokenizer


def run_scoring_job(cfg: DictConfig, decode: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """mode=eval and mode=search: load the task and the model (plus `eval.adapter`), run
    `decode(settings, model, tokenizer, task, out)` (`settings`: `EvalSettings`, built once the
    task is loaded), which writes the results, and print its summary."""
    from grammarrl.tasks import load_task

    out = run_dir(cfg)
    task = load_task(cfg)
    settings = EvalSettings.from_config(cfg)
    model, tokenizer = load_evaluated_model(cfg.model, cfg.cache_dir, cfg.device, cfg.eval.adapter)
    results = decode(settings, model, tokenizer, task, out)
    print(summary_line(results))
    return results


def run_eval(cfg: DictConfig) -> dict[str, Any]:
    """mode=eval: decode the test sets with `eval.decoding`, score them, write the results."""
    log.info(
        "eval.sampler_seeds is not used: %s decoding is deterministic, one pass per test set "
        "(its outputs can still move with eval.batch_size in bfloat16)",
        cfg.eval.decoding,
    )
    return run_scoring_job(
        cfg,
        lambda settings, model, tokenizer, task, out: evaluate(
            settings, model, tokenizer, task, cfg.eval.decoding, out, adapter=cfg.eval.adapter
        ),
    )


def summary_line(results: dict[str, Any]) -> str:
    """One line for a results record of mode=eval (or training's evaluations) or mode=search."""
    decoding, diagnostics = results["decoding"], results.get("diagnostics")
    if decoding == "beam":
        penalty = results.get("length_penalty")
        decoding = f"beam({results.get('beam_width')}{f', lp={penalty}' if penalty else ''})"
    elif diagnostics is not None:
        decoding = f"{decoding}(N={results['particles']}, {results['potential']})"
    line = (
        f"{results['task']} {results['model']} {decoding}: {results['metric']} "
        f"{results['mean']:.4f} ± {results['std']:.4f} over {len(results['scores'])} test "
        f"set(s) {[round(s, 4) for s in results['scores']]}; validity "
        f"{results['validity']:.3f}"
    )
    if diagnostics is None:
        return (
            f"{line}, truncated {results['truncated']:.3f}; "
            f"{results['seconds_per_example']:.2f} s/example -> {results['path']}"
        )
    cost = results.get("cost")
    cost_text = f"cost {cost:.1f}x greedy (tokens {results['cost_tokens']:.1f}x)" if cost else ""
    return (
        f"{line}; mean ESS {diagnostics['mean_ess']:.2f}, complete "
        f"{diagnostics['complete_selected']:.3f}, vanished {diagnostics['weights_vanished']:.3f}"
        f", posterior-weighted {diagnostics['posterior_weighted']:.4f}; {cost_text} -> "
        f"{results['path']}"
    )


def is_valid(task: Task, gen: Generation) -> bool:
    """Ended with end-of-turn in an accepting grammar state and parses under the task."""
    if not gen.finished:
        return False
    try:
        task.parse(gen.text)
    except ValueError:
        return False
    return True


def distinct_prompts(
    tokenizer: Any, task: Task, examples: list[Example]
) -> tuple[dict[str, Example], dict[str, list[int]], list[str]]:
    """Each distinct example once (test sets may share some): uid -> example, uid -> its
    forward prompt's tokens, and the uids longest prompt first (the order of the batches)."""
    unique: dict[str, Example] = {}
    for ex in examples:
        unique.setdefault(ex.uid, ex)
    prompts = {
        uid: encode_prompt(tokenizer, task.forward_messages(ex)) for uid, ex in unique.items()
    }
    return unique, prompts, sorted(unique, key=lambda uid: -len(prompts[uid]))


def decode_examples(
    decoder: ConstrainedDecoder,
    tokenizer: Any,
    task: Task,
    examples: list[Example],
    decoding: str,
    beam_width: int,
    batch_size: int,
    progress: bool = True,
    length_penalty: float | None = None,
) -> dict[str, Generation]:
    """Decode each distinct example once (by uid), in length-sorted batches; uid -> output.
    Beam decoding needs the configured `length_penalty` (`eval.length_penalty`)."""
    if decoding == "beam" and length_penalty is None:
        raise ValueError("beam decoding needs a length_penalty (eval.length_penalty)")
    from tqdm.auto import tqdm

    _, prompts, order = distinct_prompts(tokenizer, task, examples)
    outputs: dict[str, Generation] = {}
    valid = 0
    bar = tqdm(total=len(order), desc=f"eval {decoding}", unit="ex", disable=not progress)
    for start in range(0, len(order), batch_size):
        uids = order[start : start + batch_size]
        batch = [prompts[uid] for uid in uids]
        if decoding == "greedy":
            gens = decoder.greedy(batch)
        elif decoding == "beam":
            gens = [res.top for res in decoder.beam(batch, beam_width, length_penalty)]
        else:
            raise ValueError(f"unknown decoding {decoding!r}")
        for uid, gen in zip(uids, gens):
            outputs[uid] = gen
            valid += is_valid(task, gen)
        bar.update(len(uids))
        bar.set_postfix(valid=f"{valid / len(outputs):.3f}")
    bar.close()
    return outputs


def output_rewards(
    reward: str,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    examples: list[Example],
    outputs: dict[str, Generation],
    progress: bool = True,
) -> dict[str, tuple[float, float] | None]:
    """uid -> (direct, reverse) terms of its output under the reward `reward` (a
    `reward._target_`) scored by the frozen reference (`model` with its adapter disabled): the
    training reward of what a system emits, before λ and the σ's (`eval.score_rewards`). None
    for an empty output."""
    from tqdm.auto import tqdm

    from grammarrl.rl.reward import make_reward

    scoring = make_reward(reward, model, tokenizer, task)
    unique = list({ex.uid: ex for ex in examples}.values())
    return {
        ex.uid: scoring.score_output(
            ex,
            encode_prompt(tokenizer, task.forward_messages(ex)),
            outputs[ex.uid].token_ids,
            outputs[ex.uid].text,
        )
        for ex in tqdm(unique, desc="reference rewards", unit="ex", disable=not progress)
    }


def reward_means(
    rewards: dict[str, tuple[float, float] | None], test_set: list[Example]
) -> dict[str, float]:
    """Per test set: mean R_direct and R_reverse over its outputs that have tokens."""
    scored = [rewards[ex.uid] for ex in test_set if rewards[ex.uid] is not None]
    if not scored:
        return {"reward_direct": float("nan"), "reward_reverse": float("nan"), "reward_scored": 0}
    return {
        "reward_direct": sum(d for d, _ in scored) / len(scored),
        "reward_reverse": sum(r for _, r in scored) / len(scored),
        "reward_scored": len(scored),
    }


def reward_fields(
    rewards: dict[str, tuple[float, float] | None] | None, uid: str
) -> dict[str, float | None]:
    """A prediction row's reward fields ({} when rewards were not scored)."""
    if rewards is None:
        return {}
    value = rewards[uid]
    return {
        "reward_direct": value[0] if value else None,
        "reward_reverse": value[1] if value else None,
    }


def score_test_sets(
    task: Task,
    test_sets: list[list[Example]],
    selected: dict[str, Generation],
    rewards: dict[str, tuple[float, float] | None] | None,
    set_fields: Callable[[int, list[Example]], dict[str, Any]] | None = None,
    row_fields: Callable[[int, Example, Generation], dict[str, Any]] | None = None,
) -> tuple[list[float], list[dict[str, Any]], list[dict[str, Any]]]:
    """The metric of each test set's selected outputs (uid -> output), its per-set record and
    one predictions row per example; `set_fields` and `row_fields` add a method's own fields."""
    scores, per_set, rows = [], [], []
    for set_idx, test_set in enumerate(test_sets):
        gens = [selected[ex.uid] for ex in test_set]
        result = task.score([g.text for g in gens], test_set)
        scores.append(result.value)
        per_set.append(
            {
                "value": result.value,
                "size": len(test_set),
                "validity": sum(is_valid(task, g) for g in gens) / len(gens),
                "truncated": sum(g.truncated for g in gens) / len(gens),
                "task_validity": result.validity,
                **(set_fields(set_idx, test_set) if set_fields else {}),
                "details": result.details,
                **(reward_means(rewards, test_set) if rewards is not None else {}),
            }
        )
        for ex, gen, item in zip(test_set, gens, result.per_example):
            rows.append(
                {
                    "set": set_idx,
                    "uid": ex.uid,
                    "input": ex.input,
                    "gold": ex.target,
                    "prediction": gen.text,
                    "valid": is_valid(task, gen),
                    "finished": gen.finished,
                    "truncated": gen.truncated,
                    "num_tokens": gen.num_tokens,
                    "logp_constrained": gen.sum_logp_constrained,
                    "logp_unconstrained": gen.sum_logp_unconstrained,
                    "scores": item,
                    **(row_fields(set_idx, ex, gen) if row_fields else {}),
                    **reward_fields(rewards, ex.uid),
                }
            )
    return scores, per_set, rows


def output_summary(task: Task, outputs: list[Generation], seconds: float) -> dict[str, float]:
    """Validity, truncation, speed and length over the distinct outputs of a decoding pass."""
    count = max(len(outputs), 1)
    return {
        "validity": sum(is_valid(task, g) for g in outputs) / count,
        "truncated": sum(g.truncated for g in outputs) / count,
        "examples_per_second": len(outputs) / seconds if seconds > 0 else float("nan"),
        "seconds_per_example": seconds / count,
        "decode_seconds": seconds,
        "mean_output_tokens": sum(g.num_tokens for g in outputs) / count,
    }


def save_results(
    out: Path, results: dict[str, Any], rows: list[dict[str, Any]], name: str
) -> dict[str, Any]:
    """Write `<out>/<name>.json` and its predictions; the record gains `path`."""
    path = write_results(out, results, rows, name=name)
    results["path"] = str(path)
    log.info("wrote %s", path)
    return results


def evaluate(
    settings: EvalSettings,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Task,
    decoding: str,
    out: str | Path,
    name: str = "results",
    beam_width: int | None = None,
    progress: bool = True,
    adapter: str | Path | None = None,
) -> dict[str, Any]:
    """Decode the seeded test sets with `decoding` (greedy | beam), score each set, write
    `<out>/<name>.json` and the matching predictions file; returns the results record (with
    `path`). `adapter` is recorded as what produced the numbers: the adapter directory of
    `model`, None for the frozen base model."""
    beam_width = int(beam_width if beam_width is not None else settings.beam_width)
    test_sets, all_examples = test_examples(settings.test_sets, task)
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), settings.max_new_tokens)
    started = time.perf_counter()
    outputs = decode_examples(
        decoder,
        tokenizer,
        task,
        all_examples,
        decoding,
        beam_width,
        settings.batch_size,
        progress,
        length_penalty=settings.length_penalty,
    )
    seconds = time.perf_counter() - started
    rewards, scoring = None, Pass()
    if settings.score_rewards:
        with counted(model) as scoring:
            rewards = output_rewards(
                settings.reward, model, tokenizer, task, all_examples, outputs, progress
            )
    scores, per_set, rows = score_test_sets(task, test_sets, outputs, rewards)
    unique = list(outputs.values())
    results = build_results(
        task=task.name,
        model=settings.model,
        decoding=decoding,
        metric=task.metric_name,
        scores=scores,
        config=settings.config,
        **output_summary(task, unique, seconds),
        beam_width=beam_width if decoding == "beam" else None,
        length_penalty=settings.length_penalty if decoding == "beam" else None,
        **sets_summary(settings.test_sets, settings.max_new_tokens, task, test_sets, len(unique)),
        batch_size=settings.batch_size,
        adapter=adapter_name(adapter),
        device=str(decoder.device),
        dtype=dtype_name(model),
        **cost_fields(len(unique), decoder.forward_tokens, scoring, decoder.device),
        per_set=per_set,
        **check_gold(task, tokenizer, all_examples),
    )
    return save_results(Path(out), results, rows, name)
