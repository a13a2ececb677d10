"""Lightning callbacks of a training run: per-phase step timing, the run's settings in every
checkpoint, and logged steps that stay optimizer steps across resumes (the progress bar is
`grammarrl.progress.StepProgressBar`)."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig

from grammarrl.results import config_dict

RUN_RECORD = "grammarrl_run"  # checkpoint key: the settings and σ's the run trains with


class PhaseTimer(L.Callback):
    """Wall time per phase of every training step, logged as `perf/<phase>_seconds`: the
    module's own phases (rollout, scoring and policy, from `GrammarRLModule.step_seconds`),
    then backward, optimizer, and step (all of it, as the trainer runs it). `history` holds
    each step's timings, in order."""

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []
        self._started: dict[str, float] = {}  # perf_counter() when each phase began
        self._backward = 0.0  # this step's backward, seconds

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._started = {"step": time.perf_counter()}

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        self._started["backward"] = time.perf_counter()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._backward = time.perf_counter() - self._started["backward"]

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._started["optimizer"] = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        now = time.perf_counter()
        seconds = {
            **pl_module.step_seconds,
            "backward": self._backward,
            "optimizer": now - self._started["optimizer"],
            "step": now - self._started["step"],
        }
        self.history.append(seconds)
        for phase, value in seconds.items():
            pl_module.log(f"perf/{phase}_seconds", value, batch_size=1)


class RecordSettings(L.Callback):
    """Store the run's resolved config and σ's in every checkpoint, so that a resume can be
    checked against the settings the checkpoint was trained with."""

    def __init__(self, cfg: DictConfig):
        self.config = config_dict(cfg)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[RUN_RECORD] = {
            "config": self.config,
            "sigmas": [pl_module.sigma_direct, pl_module.sigma_reverse],
        }


class LoggedStepIsGlobalStep(L.Callback):
    """Log every training row at the optimizer step it belongs to, also after a resume.

    Lightning logs at its loop counter `_batches_that_stepped`, which equals `global_step` in a
    fresh run. On restore it adds one, assuming the checkpoint was written before that counter
    moved (true for `ModelCheckpoint` mid-epoch, false for the `save_checkpoint` after `fit`):
    each resume then shifted the metrics' `step` column by one. Set the counter from
    `global_step` (restored exactly) before each step logs."""

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step
