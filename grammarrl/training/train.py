"""mode=train: calibrate if needed, train the LoRA policy with GrammarRL, save, evaluate."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from omegaconf import DictConfig

from grammarrl.config.checks import device_type
from grammarrl.errors import GrammarRLError
from grammarrl.evaluation.summary import write_summary
from grammarrl.evaluation.test_sets import test_examples
from grammarrl.models.loading import add_lora, load_adapter, load_model
from grammarrl.rl.calibration import CalibrationSettings, run_sigmas
from grammarrl.runs.atomic import AtomicWriteError, atomic_write, write_jsonl
from grammarrl.runs.progress import StepProgressBar
from grammarrl.runs.results import config_dict
from grammarrl.runs.rundir import run_dir
from grammarrl.runs.tracking import current_run, table_cell
from grammarrl.training.callbacks import (
    BestDevAdapter,
    LoggedStepIsGlobalStep,
    PhaseTimer,
    RecordSettings,
    ValidatedCheckpoint,
)
from grammarrl.training.datamodule import DataSettings, GrammarRLDataModule
from grammarrl.training.module import GrammarRLModule
from grammarrl.training.policy import save_adapter
from grammarrl.training.resume import Resume, merge_metrics, prepare_run_dir, resolve_resume
from grammarrl.training.settings import StepSettings
from grammarrl.training.trained_eval import (
    TrainedEvalSettings,
    evaluate_trained,
    record_untested,
)

log = logging.getLogger(__name__)


def resolve_sigmas(
    calibration: CalibrationSettings,
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    resume: Resume | None = None,
) -> tuple[float, float]:
    """The σ's a resumed checkpoint was trained with (under this run's config: `resolve_resume`
    checked it); else from config, calibration file or paper table; otherwise calibrate now
    and store."""
    if resume is not None:
        found = (*resume.sigmas, f"the checkpoint {resume.path}")
    else:
        found = run_sigmas(calibration, model, tokenizer, task)
    sigma_direct, sigma_reverse, source = found
    log.info("σ_direct=%.4f σ_reverse=%.4f (%s)", sigma_direct, sigma_reverse, source)
    return sigma_direct, sigma_reverse


def build_loggers(out: Path, logger: str) -> list:
    """CSV metrics in the run directory, plus the job's W&B run (`grammarrl.runs.tracking`);
    `logger`: the config's `logger.name`."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    loggers: list = [CSVLogger(save_dir=str(out), name="", version="metrics")]
    run = current_run()
    if run is not None:
        loggers.append(WandbLogger(experiment=run))
    elif logger == "wandb":
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


def trainer_placement(device: str, devices: Any) -> tuple[str, Any]:
    """Lightning's (accelerator, devices): those of `device`, where the model was loaded
    (`trainer.accelerator=auto` follows it; validation refuses a contradiction), with
    `devices` (`trainer.devices`) processes."""
    if device_type(device) == "cpu":
        return "cpu", devices
    index = str(device).partition(":")[2]
    return "gpu", [int(index)] if index and devices == 1 else devices


def build_trainer(
    trainer: DictConfig,
    callbacks: DictConfig,
    out: Path,
    run_callbacks: list[L.Callback],
    *,
    device: str,
    checkpoint_every: int,
    loggers: list,
) -> L.Trainer:
    """The Lightning Trainer of the `trainer` group (Hydra `_target_`), placed on `device`
    (where the model is), with `loggers`, checkpoints every `checkpoint_every` steps (atomic
    writes; at a validation step, after the validation), `run_callbacks` (the run's: best-dev
    adapter, settings record), timing, the step progress bar unless
    `trainer.enable_progress_bar=false`, and those of the `callbacks` group."""
    from hydra.utils import instantiate

    checkpoint = ValidatedCheckpoint(
        dirpath=out / "checkpoints",
        save_last=True,
        save_top_k=0,
        every_n_train_steps=checkpoint_every,
        # always last.ckpt, which a resume reads: never last-v1.ckpt beside a last.ckpt the
        # callback did not write itself (a run directory resumed under another path)
        enable_version_counter=False,
    )
    accelerator, devices = trainer_placement(device, trainer.devices)
    extra = [instantiate(spec) for spec in callbacks.values()]
    bar = [StepProgressBar()] if trainer.get("enable_progress_bar") is not False else []
    build = instantiate(trainer, _partial_=True)  # the run's objects added as they are
    return build(
        accelerator=accelerator,
        devices=devices,
        logger=loggers,
        callbacks=[
            checkpoint,
            *run_callbacks,
            LoggedStepIsGlobalStep(),
            PhaseTimer(),
            *bar,
            *extra,
        ],
        default_root_dir=str(out),
        plugins=[AtomicCheckpointIO()],
    )


def run_train(cfg: DictConfig, resume: Resume | None | Literal["find"] = "find") -> dict[str, Any]:
    """Calibrate-if-needed, train, save the adapter, evaluate on the seeded test sets (a
    dev-only run, `train.eval_test=false`, draws none: `record_untested`). `resume`: the
    checkpoint the job's pre-flight check found (`resolve_resume`), by default found here."""
    from grammarrl.tasks import load_task

    L.seed_everything(cfg.train.seed, workers=True)
    out = run_dir(cfg)
    if resume == "find":
        resume = resolve_resume(out, cfg.train.resume, cfg.trainer.max_steps, config_dict(cfg))
    prepare_run_dir(out, resume)
    task = load_task(cfg)
    testing = TrainedEvalSettings.from_config(cfg)
    if testing.test:  # an empty test pool fails now, not in hours
        test_examples(testing.evaluation.test_sets, task)
    model, tokenizer = load_model(cfg.model, cfg.cache_dir, cfg.device)
    sigmas = resolve_sigmas(CalibrationSettings.from_config(cfg), model, tokenizer, task, resume)
    init = cfg.train.init_adapter
    policy = (
        add_lora(model, cfg.lora)
        if init is None
        else load_adapter(model, init, trainable=True, key="train.init_adapter")
    )
    module = GrammarRLModule(policy, tokenizer, task, StepSettings.from_config(cfg, *sigmas))
    best_dev = BestDevAdapter(out, task.metric_name)
    record = RecordSettings(config_dict(cfg), sigmas)  # the config with a custom task's spec merged
    trainer = build_trainer(
        cfg.trainer,
        cfg.callbacks,
        out,
        [best_dev, record],
        device=cfg.device,
        checkpoint_every=cfg.train.checkpoint_every_n_steps,
        loggers=build_loggers(out, cfg.logger.name),
    )
    datamodule = GrammarRLDataModule(task, DataSettings.from_config(cfg))
    last = out / "checkpoints" / "last.ckpt"
    fit(trainer, module, datamodule, resume, validate_first=cfg.train.val_at_start, last=last)
    if trainer.global_rank != 0:
        return {}
    merge_metrics(out)

    adapter = out / "adapter"
    save_adapter(policy, adapter)
    _save_samples(trainer, module.samples, out)
    write_jsonl(out / "validation.jsonl", module.validation_rows)
    if not testing.test:
        record = record_untested(testing, task, out, adapter, best_dev.best, trainer.global_step)
        print(f"\nNo test evaluation was run (train.eval_test=false). Wrote {record['path']}")
        return record
    best = best_dev.best if cfg.train.eval_best_dev else None
    results = evaluate_trained(
        testing, policy, tokenizer, task, out, adapter, best, trainer.global_step
    )
    summary = write_summary(out, task, results, cfg["lambda"], *sigmas)
    if summary is None:  # no frozen evaluation to compare with: the short table
        _print_summary(results)
    else:
        print("\n" + summary["text"] + f"(written to {out / 'summary.md'} and summary.json)")
    return results


def fit(
    trainer: L.Trainer,
    module: GrammarRLModule,
    datamodule: GrammarRLDataModule,
    resume: Resume | None,
    *,
    validate_first: bool,
    last: Path,
) -> None:
    """Train (from `resume`'s checkpoint, in full), after a validation at step 0 when
    `validate_first` (`train.val_at_start`) and the run starts afresh; then save the final
    step in `last`."""
    if resume is None and validate_first:
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
    trainer.save_checkpoint(last, weights_only=False)


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
