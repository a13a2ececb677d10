"""σ constants: mean within-group standard deviation of each reward term under the frozen model.

Resolution order for a run: `reward.sigma_*` set explicitly > a calibration file entry for
(task, model, N, B) measured under the run's data and prompt settings > the paper's table
(`task.sigmas[model][nN_bB]`) > calibrate now.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from grammarrl.config import rollout_key
from grammarrl.models import resolve_device, resolve_dtype

log = logging.getLogger(__name__)


def calibration_file(cfg: DictConfig) -> Path:
    """Where calibrated σ's live (one JSON for all keys)."""
    return Path(cfg.reward.calibration_file)


def calibration_key(cfg: DictConfig) -> str:
    """The key of a run's σ's: task/model/nN_bB."""
    return f"{cfg.task.name}/{cfg.model.name}/{rollout_key(cfg.rollout.num_samples, cfg.rollout.beam_width)}"


def calibration_conditions(cfg: DictConfig) -> dict[str, Any]:
    """What the σ's depend on beyond the key: the data and how prompts and candidates are built.
    An entry measured under other conditions is not reused."""
    return {
        "data_dir": cfg.data.dir,
        "split_seed": cfg.data.split_seed,
        "embedder": cfg.data.embedder,
        "num_fewshot": cfg.task.num_fewshot,
        "num_hints": cfg.task.num_hints,
        "max_new_tokens": cfg.task.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "length_penalty": cfg.rollout.length_penalty,
        "dtype": str(resolve_dtype(cfg.model.dtype, resolve_device(cfg.device))).removeprefix(
            "torch."),
    }


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def store_sigmas(cfg: DictConfig, entry: dict[str, Any]) -> Path:
    """Write one calibration entry (atomically; other keys are kept)."""
    from grammarrl.results import write_json

    path = calibration_file(cfg)
    table = _read(path)
    table[calibration_key(cfg)] = entry
    return write_json(path, dict(sorted(table.items())))


def lookup_sigmas(cfg: DictConfig) -> tuple[float, float, str] | None:
    """(σ_direct, σ_reverse, where they came from), or None when calibration is needed."""
    if cfg.reward.sigma_direct is not None and cfg.reward.sigma_reverse is not None:
        return float(cfg.reward.sigma_direct), float(cfg.reward.sigma_reverse), "config"
    entry = _read(calibration_file(cfg)).get(calibration_key(cfg))
    if entry is not None:
        differ = [f"{name}={entry.get(name, 'unrecorded')} (this run: {value})"
                  for name, value in calibration_conditions(cfg).items()
                  if entry.get(name) != value]
        if differ:
            log.warning("ignoring the calibrated σ's of %s in %s: measured with %s",
                        calibration_key(cfg), calibration_file(cfg), ", ".join(differ))
            entry = None
    if entry is not None:
        return entry["sigma_direct"], entry["sigma_reverse"], str(calibration_file(cfg))
    paper = cfg.task.sigmas.get(cfg.model.name, {}).get(
        rollout_key(cfg.rollout.num_samples, cfg.rollout.beam_width))
    if paper is not None:
        return float(paper[0]), float(paper[1]), "paper table"
    return None


def within_group_std(values: torch.Tensor, valid: torch.Tensor | None = None) -> float:
    """Mean over groups (rows) of the population standard deviation within each group, over
    its `valid` candidates (empty candidates are dropped); groups with fewer than two valid
    candidates have no spread to measure and are left out."""
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    count = valid.sum(dim=-1)
    kept = torch.where(valid, values, torch.zeros_like(values))
    mean = kept.sum(dim=-1, keepdim=True) / count.clamp(min=1).unsqueeze(-1)
    spread = torch.where(valid, (values - mean) ** 2, torch.zeros_like(values))
    std = (spread.sum(dim=-1) / count.clamp(min=1)).sqrt()
    return std[count >= 2].mean().item()


def calibrate(cfg: DictConfig, model: torch.nn.Module, tokenizer: Any, task: Any) -> dict[str, Any]:
    """Roll out the frozen model on the dev inputs with the run's (N, B) and measure the σ's."""
    from grammarrl.decoding import ConstrainedDecoder
    from grammarrl.rewards import ReferenceScorer
    from grammarrl.rollout import collect_rollouts

    dev = task.splits().dev[: cfg.task.dev_size]
    decoder = ConstrainedDecoder(model, tokenizer, task.grammar(), cfg.task.max_new_tokens)
    scorer = ReferenceScorer(model, tokenizer, task)
    generator = torch.Generator().manual_seed(cfg.seed)
    direct, reverse, valid = [], [], []
    batch = cfg.optim.batch_size
    for start in tqdm(range(0, len(dev), batch), desc=f"calibrate {calibration_key(cfg)}"):
        with torch.no_grad():
            out = collect_rollouts(decoder, scorer, tokenizer, task, dev[start:start + batch],
                                   cfg.rollout, generator)
        direct.append(out.direct)
        reverse.append(out.reverse)
        valid.append(out.valid)
    direct_t, reverse_t, valid_t = torch.cat(direct), torch.cat(reverse), torch.cat(valid)
    return {
        "sigma_direct": within_group_std(direct_t, valid_t),
        "sigma_reverse": within_group_std(reverse_t, valid_t),
        "num_inputs": len(dev),
        "mean_direct": direct_t[valid_t].mean().item(),
        "mean_reverse": reverse_t[valid_t].mean().item(),
        "seed": cfg.seed,
        **calibration_conditions(cfg),
    }


def run_calibrate(cfg: DictConfig) -> dict[str, Any]:
    """mode=calibrate: measure and store the σ's for (task, model, N, B)."""
    from grammarrl.models import load_model
    from grammarrl.results import run_dir, write_json
    from grammarrl.tasks import load_task

    task = load_task(cfg)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    entry = calibrate(cfg, model, tokenizer, task)
    path = store_sigmas(cfg, entry)
    write_json(run_dir(cfg) / "calibration.json", {calibration_key(cfg): entry})
    log.info("σ_direct=%.4f σ_reverse=%.4f -> %s [%s]", entry["sigma_direct"],
             entry["sigma_reverse"], path, calibration_key(cfg))
    print(json.dumps({"key": calibration_key(cfg), **entry}))
    return entry
