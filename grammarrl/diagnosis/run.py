"""mode=diagnose: will GrammarRL help on this task, with this model? Minutes on the frozen model
instead of hours of training (docs/diagnose.md).

    python -m grammarrl.run mode=diagnose task=custom task.spec=examples/support_tickets/task.yaml

1. The σ's as training would use them (config, calibration file, paper table; else calibrated
   on the dev inputs now and stored, as training does).
2. On K dev inputs (`diagnose.num_inputs`: the dev split, then the dev reserve, as validation
   slices take them), greedy + M constrained samples (`diagnose.num_samples`), each scored with
   R_direct and R_reverse: the metric of greedy, of the oracle and of the reward's argmax per λ
   (`diagnose.lambdas`) over the inputs with gold outputs; the reward gap and how often the
   argmax moves without them.
3. On up to `diagnose.num_labelled` labelled rows (the dev rows with gold outputs, else the labelled training rows;
   never test rows), each gold output next to its perturbations (`perturb`): how often each
   reward prefers gold, per field.
4. The lift cross-fitted over two halves of the labelled dev inputs (`crossfit`), the verdict,
   the reranking λ and the training λ (`verdict`); diagnosis.md, diagnosis.json, diagnosis.png.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grammarrl.decoding import ConstrainedDecoder
from grammarrl.diagnosis.candidates import Group, decoded_groups, written_group
from grammarrl.diagnosis.concordance import Pair, pairs_of
from grammarrl.diagnosis.judge import judge
from grammarrl.diagnosis.perturb import Perturber
from grammarrl.diagnosis.report import MARKDOWN, PLOT, write_report
from grammarrl.diagnosis.selection import Sigmas
from grammarrl.diagnosis.settings import DiagnoseSettings
from grammarrl.rl.calibration import CalibrationSettings, run_sigmas
from grammarrl.rl.reward import Reward, make_reward
from grammarrl.runs.results import dtype_name
from grammarrl.runs.rundir import run_dir
from grammarrl.tasks.base import Task
from grammarrl.tasks.grammar_check import GrammarChecker
from grammarrl.types import Example

log = logging.getLogger(__name__)


def dev_inputs(task: Task, count: int) -> list[Example]:
    """The first `count` dev inputs: the dev split, then the dev reserve (as validation)."""
    splits = task.splits()
    return (splits.dev + splits.dev_reserve)[:count]


def labelled_rows(task: Task, count: int) -> tuple[list[Example], str]:
    """Up to `count` rows with gold outputs: the dev ones, else the training ones (never test
    rows); and which they are, in words."""
    splits = task.splits()
    dev = [ex for ex in splits.dev + splits.dev_reserve if ex.target]
    if dev:
        return dev[:count], "dev rows with gold outputs"
    train = [ex for ex in splits.train if ex.target][:count]
    if train:
        return train, "the first labelled training rows: the dev rows have no gold outputs"
    return [], "no dev or training row has a gold output"


def field_pairs(
    task: Task,
    reward: Reward,
    tokenizer: Any,
    rows: list[Example],
    perturber: Perturber,
    progress: bool = True,
) -> tuple[list[Pair], list[dict[str, Any]]]:
    """Each row's gold output and perturbations, scored: the pairs and their rows for the file."""
    from tqdm.auto import tqdm

    pairs: list[Pair] = []
    records = []
    for ex in tqdm(rows, desc="diagnose: perturbations", unit="row", disable=not progress):
        perturbations = perturber(ex.target, ex.input)
        if not perturbations:
            records.append({"part": "unperturbed", "uid": ex.uid, "gold": ex.target})
            continue
        group = written_group(
            reward, tokenizer, task, ex, [ex.target, *(p.text for p in perturbations)]
        )
        found = pairs_of(group, perturbations)
        pairs += found
        records += [
            {
                "part": "pair",
                "uid": ex.uid,
                "field": pair.perturbation.field,
                "kind": pair.perturbation.kind,
                "gold": ex.target,
                "perturbed": pair.perturbation.text,
                "gold_rewards": pair.gold,
                "perturbed_rewards": pair.other,
            }
            for pair in found
        ]
    return pairs, records


def run_diagnose(cfg: DictConfig) -> dict[str, Any]:
    """mode=diagnose (module docstring): writes the three files, prints the verdict."""
    from grammarrl.tasks import load_task

    out = run_dir(cfg)
    seconds: dict[str, float] = {}
    started = time.perf_counter()

    def lap(phase: str) -> None:
        seconds[phase] = time.perf_counter() - started - sum(seconds.values())

    task = load_task(cfg)
    settings = DiagnoseSettings.from_config(cfg)  # after load_task: a custom spec merged
    model, tokenizer = _frozen_model(cfg.model, cfg.cache_dir, cfg.device)
    lap("loading")
    sigmas = _sigmas(CalibrationSettings.from_config(cfg), model, tokenizer, task)
    lap("σ's")
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), settings.max_new_tokens)
    reward = make_reward(settings.reward, model, tokenizer, task)
    groups = decoded_groups(
        decoder,
        reward,
        tokenizer,
        task,
        dev_inputs(task, settings.num_inputs),
        settings.num_samples,
        settings.temperature,
        settings.batch_size,
        torch.Generator().manual_seed(settings.seed),
    )
    lap("candidates")
    fields_record, pairs, pair_records, golds = _perturbations(settings, task, reward, tokenizer)
    lap("perturbations")
    curve, table, verdict = judge(settings, task, groups, pairs, sigmas, golds)
    fields_record["table"] = table or {}
    lap("cross-fitting")
    record = {
        "task": task.name,
        "model": settings.model,
        "metric": task.metric_name,
        "device": str(decoder.device),
        "dtype": dtype_name(model),
        "verdict": vars(verdict),
        "sigmas": vars(sigmas),
        "settings": settings.record(),
        "candidates": curve,
        "fields": fields_record,
        "seconds": seconds,
        "config": settings.config,
    }
    path = write_report(out, record, _candidate_records(groups) + pair_records)
    print(f"{verdict.text}\n-> {path}, {out / MARKDOWN}, {out / PLOT}")
    said = ("outlook", "reranking_lambda", "training_lambda")
    return {"path": str(path), **{name: getattr(verdict, name) for name in said}}


def _frozen_model(
    model_cfg: DictConfig, cache_dir: str | Path, device: str
) -> tuple[torch.nn.Module, Any]:
    """The frozen model of the config's `model` group, in eval mode (the CPU allocator steadied
    for inference)."""
    from grammarrl.models.loading import INFERENCE_MMAP_THRESHOLD, load_model, steady_cpu_allocator

    model, tokenizer = load_model(model_cfg, cache_dir, device)
    model.eval()
    if model.device.type == "cpu":
        steady_cpu_allocator(INFERENCE_MMAP_THRESHOLD)
    return model, tokenizer


def _sigmas(
    calibration: CalibrationSettings, model: torch.nn.Module, tokenizer: Any, task: Task
) -> Sigmas:
    """The σ's as training resolves them, and where they came from (no path of this machine)."""
    direct, reverse, source = run_sigmas(calibration, model, tokenizer, task)
    log.info("σ_direct=%.4f σ_reverse=%.4f (%s)", direct, reverse, source)
    if source == str(calibration.file):
        source = "the calibration file, reward.calibration_file"
    return Sigmas(direct, reverse, source)


def _perturbations(
    settings: DiagnoseSettings, task: Task, reward: Reward, tokenizer: Any
) -> tuple[dict[str, Any], list[Pair], list[dict[str, Any]], list[str]]:
    """The labelled rows' gold outputs against their perturbations: the record's `fields` part
    (which rows, how; its table comes from `judge`), the scored pairs, the rows file's records
    and the labelled rows' gold outputs."""
    rows, which = labelled_rows(task, settings.num_labelled)
    accepts = GrammarChecker(task.grammar(), tokenizer).accepts
    perturber = Perturber(task, accepts, [ex.target for ex in rows], settings.seed)
    pairs, pair_records = field_pairs(task, reward, tokenizer, rows, perturber)
    unperturbed = sum(r["part"] == "unperturbed" for r in pair_records)
    if unperturbed:  # said, not dropped silently
        which += (
            f"; {unperturbed} of the {len(rows)} gave no perturbation (a gold output must be "
            "one-line JSON as json.dumps writes it, with another value the grammar accepts)"
        )
    per_field = perturber.per_field
    record = {
        "rows": which,
        "labelled": len(rows),
        "per_field": per_field,
        "how": "the same output with one field changed (other values, empty, an input span, a "
        "demonstration's value)"
        if per_field
        else "other outputs (other choices, else other gold outputs)",
    }
    return record, pairs, pair_records, [ex.target for ex in rows]


def _candidate_records(groups: list[Group]) -> list[dict[str, Any]]:
    """One diagnosis_rows.jsonl row per dev input: its candidates and their two rewards."""
    return [
        {
            "part": "candidates",
            "uid": g.example.uid,
            "gold": g.example.target or None,
            "texts": g.texts,
            "direct": g.direct,
            "reverse": g.reverse,
        }
        for g in groups
    ]
