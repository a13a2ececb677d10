"""mode=train: calibrate if needed, train the LoRA policy with GrammarRL, save, evaluate."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from grammarrl.calibration import calibrate, calibration_key, lookup_sigmas, store_sigmas
from grammarrl.datamodule import GrammarRLDataModule
from grammarrl.errors import ConfigError, GrammarRLError, ModelError
from grammarrl.models import add_lora, load_model, reference_mode
from grammarrl.module import GrammarRLModule
from grammarrl.results import ResultsWriteError, atomic_write, run_dir, write_jsonl

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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temp file beside the target, fsynced, then renamed over it: a
    kill or a full disk mid-write leaves the previous checkpoint intact. (Lightning's own write
    stages the file in the system temp dir and moves it, a plain copy across filesystems.)"""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        if "://" in str(path):  # remote storage: Lightning's fsspec transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_write(path, lambda handle: torch.save(checkpoint, handle), binary=True)
        except ResultsWriteError as err:
            reason = getattr(err.__cause__, "strerror", None) or err.__cause__
            raise GrammarRLError(f"cannot write checkpoint {path}: {reason}; "
                                 "the previous checkpoint there is intact") from err.__cause__


def resolve_resume(cfg: DictConfig, out: Path) -> str | None:
    """The checkpoint to resume from: `train.resume=auto` (default) takes `<run>/checkpoints/
    last.ckpt` when it exists (a restarted run with the same run dir), null starts afresh, a
    path must be a readable checkpoint. A corrupt or truncated checkpoint is a ModelError."""
    value = cfg.train.resume
    if value is None or str(value).lower() in ("null", "none", "false"):
        return None
    if str(value) == "auto":
        path = out / "checkpoints" / "last.ckpt"
        for stale in path.parent.glob(".*.tmp"):  # a write cut by a kill
            stale.unlink(missing_ok=True)
        if not path.is_file():
            return None
    else:
        path = Path(str(value))
        if not path.is_file():
            raise ConfigError(f"train.resume={value}: no such checkpoint file "
                              "(expected auto, null or the path of a .ckpt file)")
    step = inspect_checkpoint(path)
    log.info("Resuming from %s (%d steps done)", path, step)
    return str(path)


def inspect_checkpoint(path: Path) -> int:
    """The global step of a training checkpoint; ModelError if it cannot be read as one."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # truncated zip, garbage, pickle errors: all mean "unreadable"
        raise ModelError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''}); delete it to start over, "
            "or pass train.resume=null or another checkpoint") from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "global_step" not in ckpt:
        raise ModelError(f"{path} is not a GrammarRL training checkpoint (no state_dict/global_step)")
    return int(ckpt["global_step"])


METRICS_KEPT = "metrics.resumed.csv"


def _read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    keys = sorted({k for row in rows for k in row})

    def write(handle) -> None:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)

    atomic_write(path, write)


def stash_metrics(out: Path, resume_step: int) -> None:
    """Lightning's CSV logger deletes metrics.csv when it starts: on resume, keep the rows of
    the steps already done in metrics/metrics.resumed.csv (merged back by `merge_metrics`)."""
    folder = out / "metrics"
    current, kept = folder / "metrics.csv", folder / METRICS_KEPT
    rows = [r for r in _read_rows(kept) + _read_rows(current)
            if r.get("step") not in (None, "") and int(float(r["step"])) < resume_step]
    if rows:
        _write_rows(kept, rows)
    current.unlink(missing_ok=True)


def merge_metrics(out: Path) -> None:
    """After a resumed run: metrics.csv = rows kept from before the restart + the new rows."""
    folder = out / "metrics"
    kept = folder / METRICS_KEPT
    if kept.is_file():
        _write_rows(folder / "metrics.csv", _read_rows(kept) + _read_rows(folder / "metrics.csv"))
        kept.unlink()


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
        plugins=[AtomicCheckpointIO()],
        use_distributed_sampler=False,  # the step-indexed batch sampler already splits by rank
    )


def run_train(cfg: DictConfig) -> dict[str, Any]:
    """Calibrate-if-needed, train, save the adapter, evaluate on the seeded test sets."""
    from grammarrl.evaluate import evaluate
    from grammarrl.tasks import load_task

    L.seed_everything(cfg.seed, workers=True)
    out = run_dir(cfg)
    task = load_task(cfg)
    task.test_sets(cfg.eval.num_test_sets, cfg.eval.test_size, cfg.seed)  # an empty test pool
    # fails now, not after hours of training
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    sigma_direct, sigma_reverse = resolve_sigmas(cfg, model, tokenizer, task)
    policy = add_lora(model, cfg.lora)
    module = GrammarRLModule(cfg, policy, tokenizer, task, sigma_direct, sigma_reverse)
    resume = resolve_resume(cfg, out)
    if resume is not None:
        stash_metrics(out, inspect_checkpoint(Path(resume)))
    trainer = build_trainer(cfg, out)
    trainer.fit(module, datamodule=GrammarRLDataModule(cfg, task), ckpt_path=resume)
    # The final step, resumable. Not reached when fit raised (e.g. a non-finite loss), so
    # last.ckpt then stays the last good periodic checkpoint.
    trainer.save_checkpoint(out / "checkpoints" / "last.ckpt")
    if trainer.global_rank != 0:
        return {}
    merge_metrics(out)

    policy.save_pretrained(out / "adapter")
    _save_samples(trainer, module.samples, out)
    policy.eval()
    # results.json (greedy) is written last: its presence marks the run as complete (a sweep
    # re-run skips the job), so a crash before it re-runs the evaluations on restart.
    results = {}
    if cfg.train.eval_beam:
        results["beam"] = evaluate(cfg, policy, tokenizer, task, "beam", out, name="results_beam")
    if cfg.train.eval_baseline:
        with reference_mode(policy):
            results["baseline"] = evaluate(cfg, policy, tokenizer, task, "greedy", out,
                                           name="results_baseline")
    results = {"greedy": evaluate(cfg, policy, tokenizer, task, "greedy", out, name="results"),
               **results}
    _print_summary(results)
    return results


def _save_samples(trainer: L.Trainer, samples: list[dict[str, Any]], out: Path) -> None:
    """Rollout samples (first input of each step) as JSONL, and as a W&B table when logging there."""
    write_jsonl(out / "samples.jsonl", samples)
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
