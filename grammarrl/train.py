"""mode=train: calibrate if needed, train the LoRA policy with GrammarRL, save, evaluate."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from grammarrl.calibration import calibrate, calibration_key, lookup_sigmas, store_sigmas
from grammarrl.datamodule import GrammarRLDataModule
from grammarrl.models import add_lora, load_model, reference_mode
from grammarrl.module import GrammarRLModule
from grammarrl.results import run_dir

log = logging.getLogger(__name__)


def resolve_sigmas(cfg: DictConfig, model: torch.nn.Module, tokenizer: Any, task: Any) -> tuple[float, float]:
    """σ's from config, calibration file or paper table; otherwise calibrate now and store."""
    found = lookup_sigmas(cfg)
    if found is None:
        log.info("No σ's for %s: calibrating on %d dev inputs first",
                 calibration_key(cfg), cfg.task.dev_size)
        entry = calibrate(cfg, model, tokenizer, task)
        store_sigmas(cfg, entry)
        found = entry["sigma_direct"], entry["sigma_reverse"], "calibrated now"
    sigma_direct, sigma_reverse, source = found
    log.info("σ_direct=%.4f σ_reverse=%.4f (%s)", sigma_direct, sigma_reverse, source)
    return sigma_direct, sigma_reverse


def build_loggers(cfg: DictConfig, out: Path) -> list:
    """CSV metrics in the run directory, plus W&B (offline by default) when configured."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    loggers: list = [CSVLogger(save_dir=str(out), name="", version="metrics")]
    if cfg.logger.name == "wandb":
        rollout = cfg.rollout
        tags = [f"task={cfg.task.name}", f"model={cfg.model.name}", f"lambda={cfg['lambda']}",
                f"N={rollout.num_samples}", f"B={rollout.beam_width}", "decoding=greedy",
                *cfg.logger.tags]
        loggers.append(WandbLogger(
            project=cfg.logger.project, group=cfg.logger.group or sweep_group(), tags=tags,
            mode=cfg.logger.mode,
            save_dir=str(out), config=OmegaConf.to_container(cfg, resolve=True),
        ))
    return loggers


def sweep_group() -> str | None:
    """Runs of one Hydra multirun share a W&B group: the sweep directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return str(HydraConfig.get().sweep.dir)
    return None


def build_trainer(cfg: DictConfig, out: Path) -> L.Trainer:
    """A Lightning Trainer from the trainer/optim config groups."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0,
                                 every_n_train_steps=cfg.trainer.checkpoint_every_n_steps)
    return L.Trainer(
        accelerator=cfg.trainer.accelerator, devices=cfg.trainer.devices,
        strategy=cfg.trainer.strategy, max_steps=cfg.optim.max_steps,
        gradient_clip_val=cfg.optim.grad_clip, val_check_interval=cfg.trainer.val_check_interval,
        check_val_every_n_epoch=None, num_sanity_val_steps=0,
        log_every_n_steps=cfg.trainer.log_every_n_steps, logger=build_loggers(cfg, out),
        callbacks=[checkpoint], default_root_dir=str(out), enable_model_summary=False,
    )


def run_train(cfg: DictConfig) -> dict[str, Any]:
    """Calibrate-if-needed, train, save the adapter, evaluate on the seeded test sets."""
    from grammarrl.evaluate import evaluate
    from grammarrl.tasks import load_task

    L.seed_everything(cfg.seed, workers=True)
    out = run_dir(cfg)
    task = load_task(cfg)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    sigma_direct, sigma_reverse = resolve_sigmas(cfg, model, tokenizer, task)
    policy = add_lora(model, cfg.lora)
    module = GrammarRLModule(cfg, policy, tokenizer, task, sigma_direct, sigma_reverse)
    trainer = build_trainer(cfg, out)
    trainer.fit(module, datamodule=GrammarRLDataModule(cfg, task), ckpt_path=cfg.train.resume)
    trainer.save_checkpoint(out / "checkpoints" / "last.ckpt")  # the final step, resumable
    if trainer.global_rank != 0:
        return {}

    policy.save_pretrained(out / "adapter")
    _save_samples(trainer, module.samples, out)
    policy.eval()
    results = {"greedy": evaluate(cfg, policy, tokenizer, task, "greedy", out, name="results")}
    if cfg.train.eval_beam:
        results["beam"] = evaluate(cfg, policy, tokenizer, task, "beam", out, name="results_beam")
    if cfg.train.eval_baseline:
        with reference_mode(policy):
            results["baseline"] = evaluate(cfg, policy, tokenizer, task, "greedy", out,
                                           name="results_baseline")
    _print_summary(results)
    return results


def _save_samples(trainer: L.Trainer, samples: list[dict[str, Any]], out: Path) -> None:
    """Rollout samples (first input of each step) as JSONL, and as a W&B table when logging there."""
    with open(out / "samples.jsonl", "w") as f:
        for row in samples:
            f.write(json.dumps(row) + "\n")
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and samples:
            columns = list(samples[0])
            logger.log_table(key="rollout_samples", columns=columns,
                             data=[[json.dumps(r[c]) if isinstance(r[c], list) else r[c]
                                    for c in columns] for r in samples])


def _print_summary(results: dict[str, dict[str, Any]]) -> None:
    """A short table: each evaluation's metric, mean ± std over test sets, validity."""
    print(f"\n{'run':<10} {'metric':<16} {'mean ± std':<18} validity")
    for name, res in results.items():
        print(f"{name:<10} {res['metric']:<16} {res['mean']:.4f} ± {res['std']:.4f}    "
              f"{res['validity']:.3f}")
