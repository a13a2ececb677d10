"""mode=train: calibrate if needed, train the LoRA policy with GrammarRL, save, evaluate."""

from __future__ import annotations

import csv
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from omegaconf import DictConfig

from grammarrl.config.checks import device_type, resume_setting
from grammarrl.errors import ConfigError, GrammarRLError, ModelError
from grammarrl.evaluation.summary import write_summary
from grammarrl.evaluation.test_sets import test_examples
from grammarrl.models.loading import add_lora, load_adapter, load_model
from grammarrl.rl.calibration import run_sigmas
from grammarrl.runs.atomic import AtomicWriteError, atomic_write, write_jsonl
from grammarrl.runs.progress import StepProgressBar
from grammarrl.runs.results import config_dict
from grammarrl.runs.rundir import (
    BOOKKEEPING,
    CONTINUABLE,
    MODE_UNUSED,
    current_names,
    describe,
    differing_keys,
    run_dir,
)
from grammarrl.runs.tracking import current_run, table_cell
from grammarrl.training.callbacks import (
    RUN_RECORD,
    BestDevAdapter,
    LoggedStepIsGlobalStep,
    PhaseTimer,
    RecordSettings,
)
from grammarrl.training.datamodule import GrammarRLDataModule
from grammarrl.training.module import GrammarRLModule
from grammarrl.training.trained_eval import evaluate_trained

log = logging.getLogger(__name__)


def resolve_sigmas(
    cfg: DictConfig, model: torch.nn.Module, tokenizer: Any, task: Any, resume: Resume | None = None
) -> tuple[float, float]:
    """The σ's a resumed checkpoint was trained with (under this run's config: `resolve_resume`
    checked it); else from config, calibration file or paper table; otherwise calibrate now
    and store."""
    if resume is not None:
        found = (*resume.sigmas, f"the checkpoint {resume.path}")
    else:
        found = run_sigmas(cfg, model, tokenizer, task)
    sigma_direct, sigma_reverse, source = found
    log.info("σ_direct=%.4f σ_reverse=%.4f (%s)", sigma_direct, sigma_reverse, source)
    return sigma_direct, sigma_reverse


def build_loggers(cfg: DictConfig, out: Path) -> list:
    """CSV metrics in the run directory, plus the job's W&B run (`grammarrl.runs.tracking`)."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    loggers: list = [CSVLogger(save_dir=str(out), name="", version="metrics")]
    run = current_run()
    if run is not None:
        loggers.append(WandbLogger(experiment=run))
    elif cfg.logger.name == "wandb":
        log.warning(
            "logger=wandb, but no W&B run was started for this job (run_train called "
            "outside `python -m grammarrl.run`): metrics go to %s only",
            out / "metrics",
        )
    return loggers


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temp file beside the target, fsynced, then renamed over it: a
    kill or a full disk mid-write leaves the previous checkpoint intact. (Lightning's own write
    stages the file in the system temp dir and moves it, a plain copy across filesystems.)"""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if "://" in str(path):  # remote storage: Lightning's fsspec transaction
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_write(path, lambda handle: torch.save(checkpoint, handle), binary=True)
        except AtomicWriteError as err:
            reason = getattr(err.__cause__, "strerror", None) or err.__cause__
            raise GrammarRLError(
                f"cannot write checkpoint {path}: {reason}; the previous checkpoint there is intact"
            ) from err.__cause__


@dataclass(frozen=True)
class Resume:
    """A checkpoint this run continues from."""

    path: Path
    step: int  # optimizer steps it holds
    sigmas: tuple[float, float]  # the σ's it was trained with
    changes: str = ""  # settings changed since that a resume allows (`CONTINUABLE`), logged


def resolve_resume(cfg: DictConfig, out: Path) -> Resume | None:
    """The checkpoint to resume from: `train.resume=auto` (default) takes `<run>/checkpoints/
    last.ckpt` when it exists (a restarted run with the same run dir), null starts afresh, a
    path must be a checkpoint: where the run starts, until it has written its own
    `last.ckpt`, which a restart then continues from (the same command resumes it). It must
    have been trained with this run's settings, except the `CONTINUABLE` ones (more steps,
    evaluation): a ConfigError names those that differ. A corrupt or truncated checkpoint is a
    ModelError."""
    setting = resume_setting(cfg.train.resume)
    if setting is None:
        return None
    own = out / "checkpoints" / "last.ckpt"
    path = own if setting == "auto" or own.is_file() else Path(setting)
    if setting != "auto" and path == own and own.resolve() != Path(setting).resolve():
        log.info(
            "train.resume=%s: this run has its own checkpoint %s; continuing from it", setting, own
        )
    if not path.is_file():
        return None
    ckpt = read_checkpoint(path)
    step, record = int(ckpt["global_step"]), ckpt.get(RUN_RECORD)
    if record is None:
        raise ConfigError(
            f"train.resume={cfg.train.resume}: {path} records no training settings "
            "(written by an older GrammarRL), so the resume cannot be checked; "
            "train.resume=null starts afresh"
        )
    old, new = current_names(record["config"]), config_dict(cfg)
    unused = (*BOOKKEEPING, *MODE_UNUSED["train"])  # e.g. the diagnose group, added since
    changed = differing_keys(old, new, ignore=(*unused, *CONTINUABLE))
    if changed:
        raise ConfigError(
            f"train.resume={cfg.train.resume}: {path} was trained with other settings: "
            f"{describe(old, new, changed)}; resume with the same settings, or "
            "start afresh (train.resume=null, in a new directory)"
        )
    if cfg.trainer.max_steps < step:
        raise ConfigError(
            f"trainer.max_steps={cfg.trainer.max_steps} is below the {step} steps "
            f"{path} already holds: resume with trainer.max_steps >= {step}"
        )
    changes = describe(old, new, differing_keys(old, new, ignore=unused))
    return Resume(path, step, tuple(record["sigmas"]), changes)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A training checkpoint (tensors memory-mapped); ModelError if it cannot be read as one."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # truncated zip, garbage, pickle errors: all mean "unreadable"
        raise ModelError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200] if str(err) else ''}); delete it to start over, "
            "or pass train.resume=null or another checkpoint"
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "global_step" not in ckpt:
        raise ModelError(
            f"{path} is not a GrammarRL training checkpoint (no state_dict/global_step)"
        )
    return ckpt


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


def stash_metrics(out: Path, resume: Resume) -> None:
    """Lightning's CSV logger deletes metrics.csv when it starts: on resume, keep the rows of
    the steps already done in metrics/metrics.resumed.csv (merged back by `merge_metrics`). A
    run started from another run's checkpoint (`train.resume=PATH`) starts with that run's rows,
    so its curves begin at step 0."""
    folder = out / "metrics"
    current, kept = folder / "metrics.csv", folder / METRICS_KEPT
    rows = _read_rows(kept) + _read_rows(current)
    source = resume.path.parent.parent / "metrics"  # <run>/checkpoints/last.ckpt -> <run>/metrics
    if not rows and source.resolve() != folder.resolve():
        rows = _read_rows(source / METRICS_KEPT) + _read_rows(source / "metrics.csv")
    rows = [
        r for r in rows if r.get("step") not in (None, "") and int(float(r["step"])) < resume.step
    ]
    if rows:
        folder.mkdir(parents=True, exist_ok=True)
        _write_rows(kept, rows)
    current.unlink(missing_ok=True)


def merge_metrics(out: Path) -> None:
    """After a resumed run: metrics.csv = rows kept from before the restart + the new rows."""
    folder = out / "metrics"
    kept = folder / METRICS_KEPT
    if kept.is_file():
        _write_rows(folder / "metrics.csv", _read_rows(kept) + _read_rows(folder / "metrics.csv"))
        kept.unlink()


def trainer_placement(cfg: DictConfig) -> tuple[str, Any]:
    """Lightning's (accelerator, devices): those of `device`, where the model was loaded
    (`trainer.accelerator=auto` follows it; validation refuses a contradiction)."""
    if device_type(cfg.device) == "cpu":
        return "cpu", cfg.trainer.devices
    index = str(cfg.device).partition(":")[2]
    return "gpu", [int(index)] if index and cfg.trainer.devices == 1 else cfg.trainer.devices


def build_trainer(cfg: DictConfig, out: Path, best_dev: BestDevAdapter) -> L.Trainer:
    """The Lightning Trainer of `cfg.trainer` (Hydra `_target_`), placed where the model is,
    with the run's loggers, checkpoints (atomic writes), callbacks (the step progress bar unless
    `trainer.enable_progress_bar=false`) and those of `callbacks`."""
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(
        dirpath=out / "checkpoints",
        save_last=True,
        save_top_k=0,
        every_n_train_steps=cfg.train.checkpoint_every_n_steps,
    )
    accelerator, devices = trainer_placement(cfg)
    extra = [instantiate(spec) for spec in cfg.callbacks.values()]
    bar = [StepProgressBar()] if cfg.trainer.get("enable_progress_bar") is not False else []
    trainer = instantiate(cfg.trainer, _partial_=True)  # the run's objects added as they are
    return trainer(
        accelerator=accelerator,
        devices=devices,
        logger=build_loggers(cfg, out),
        callbacks=[
            checkpoint,
            best_dev,
            RecordSettings(cfg),
            LoggedStepIsGlobalStep(),
            PhaseTimer(),
            *bar,
            *extra,
        ],
        default_root_dir=str(out),
        plugins=[AtomicCheckpointIO()],
    )


def run_train(cfg: DictConfig, resume: Resume | None | Literal["find"] = "find") -> dict[str, Any]:
    """Calibrate-if-needed, train, save the adapter, evaluate on the seeded test sets. `resume`:
    the checkpoint the job's pre-flight check found (`resolve_resume`), by default found here."""
    from grammarrl.tasks import load_task

    L.seed_everything(cfg.train.seed, workers=True)
    out = run_dir(cfg)
    for cut in (out / "checkpoints").glob(".*.tmp"):  # a checkpoint write cut by a kill
        cut.unlink(missing_ok=True)
    if resume == "find":
        resume = resolve_resume(cfg, out)
    if resume is not None:
        log.info(
            "Resuming from %s (%d steps done)%s",
            resume.path,
            resume.step,
            f"; changed since: {resume.changes}" if resume.changes else "",
        )
        stash_metrics(out, resume)
    task = load_task(cfg)
    test_examples(cfg, task)  # an empty test pool fails now, not after hours of training
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    sigma_direct, sigma_reverse = resolve_sigmas(cfg, model, tokenizer, task, resume)
    init = cfg.train.init_adapter
    policy = (
        add_lora(model, cfg.lora)
        if init is None
        else load_adapter(model, init, trainable=True, key="train.init_adapter")
    )
    module = GrammarRLModule(cfg, policy, tokenizer, task, sigma_direct, sigma_reverse)
    best_dev = BestDevAdapter(out, task.metric_name)
    trainer = build_trainer(cfg, out, best_dev)
    datamodule = GrammarRLDataModule(cfg, task)
    if resume is None and cfg.train.val_at_start:
        trainer.validate(module, datamodule=datamodule, verbose=False)  # the curves' step 0
    # Our checkpoints hold RNG and sampler states besides tensors: load them in full.
    resume_args = (
        {"ckpt_path": str(resume.path), "weights_only": False} if resume is not None else {}
    )
    if "weights_only" not in inspect.signature(trainer.fit).parameters:  # Lightning < 2.5
        resume_args.pop("weights_only", None)
    trainer.fit(module, datamodule=datamodule, **resume_args)
    # The final step, resumable. Not reached when fit raised (e.g. a non-finite loss), so
    # last.ckpt then stays the last good periodic checkpoint.
    trainer.save_checkpoint(out / "checkpoints" / "last.ckpt", weights_only=False)
    if trainer.global_rank != 0:
        return {}
    merge_metrics(out)

    adapter = out / "adapter"
    policy.save_pretrained(adapter)
    _save_samples(trainer, module.samples, out)
    write_jsonl(out / "validation.jsonl", module.validation_rows)
    best = best_dev.best if cfg.train.eval_best_dev else None
    results = evaluate_trained(
        cfg, policy, tokenizer, task, out, adapter, best, trainer.global_step
    )
    summary = write_summary(out, task, results, cfg["lambda"], sigma_direct, sigma_reverse)
    if summary is None:  # no frozen evaluation to compare with: the short table
        _print_summary(results)
    else:
        print("\n" + summary["text"] + f"(written to {out / 'summary.md'} and summary.json)")
    return results


def _save_samples(trainer: L.Trainer, samples: list[dict[str, Any]], out: Path) -> None:
    """Rollout samples (first input of each step) as JSONL, and as a W&B table when logging there."""
    write_jsonl(out / "samples.jsonl", samples)
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and samples:
            columns = list(samples[0])
            logger.log_table(
                key="rollout_samples",
                columns=columns,
                data=[[table_cell(r[c]) for c in columns] for r in samples],
            )


def _print_summary(results: dict[str, dict[str, Any]]) -> None:
    """A short table: each evaluation's metric, mean ± std over test sets, validity."""
    print(f"\n{'run':<10} {'metric':<16} {'mean ± std':<18} validity")
    for name, res in results.items():
        print(
            f"{name:<10} {res['metric']:<16} {res['mean']:.4f} ± {res['std']:.4f}    "
            f"{res['validity']:.3f}"
        )
