"""Lightning callbacks of a training run: checkpoints that wait for a step's validation,
per-phase step timing, the run's settings in every checkpoint, logged steps that stay optimizer
steps across resumes, and the adapter of the step with the best dev metric (the progress bar is
`grammarrl.runs.progress.StepProgressBar`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from grammarrl.runs.atomic import write_json
from grammarrl.runs.results import adapter_name
from grammarrl.runs.timing import clock
from grammarrl.training.policy import save_adapter

RUN_RECORD = "grammarrl_run"  # checkpoint key: the settings and σ's the run trains with
BEST_DEV_ADAPTER = "adapter-best-dev"  # run-dir entries of `BestDevAdapter`
BEST_DEV_RECORD = "best_dev.json"


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
        self._started = {"step": clock()}

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        self._started["backward"] = clock()

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._backward = clock() - self._started["backward"]

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._started["optimizer"] = clock()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        now = clock()
        seconds = {
            **pl_module.step_seconds,
            "backward": self._backward,
            "optimizer": now - self._started["optimizer"],
            "step": now - self._started["step"],
        }
        self.history.append(seconds)
        for phase, value in seconds.items():
            pl_module.log(f"perf/{phase}_seconds", value, batch_size=1)


class ValidatedCheckpoint(ModelCheckpoint):
    """Lightning's `ModelCheckpoint` every `every_n_train_steps` steps, except that at a step
    validation runs at, the checkpoint waits for that validation. Written before it, a run
    killed while validating resumed past it: Lightning does not validate a restored step again,
    so that step's dev point (and a dev-best at it) was lost; written after, the resume retrains
    from the checkpoint before, exactly, and validates."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._after_validation = False  # this step's checkpoint waits for its validation

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loop = trainer.fit_loop
        if loop.epoch_loop._should_check_val_fx(loop._data_fetcher):
            every = self._every_n_train_steps
            self._after_validation = every > 0 and trainer.global_step % every == 0
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)  # saves here by itself in Lightning < 2.5
        if self._after_validation and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        self._after_validation = False


class RecordSettings(L.Callback):
    """Store the run's resolved config (`config_dict`) and σ's in every checkpoint, so that a
    resume can be checked against the settings the checkpoint was trained with."""

    def __init__(self, config: dict[str, Any], sigmas: tuple[float, float]):
        self.config = config
        self.sigmas = sigmas

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[RUN_RECORD] = {"config": self.config, "sigmas": list(self.sigmas)}


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


class BestDevAdapter(L.Callback):
    """Keep the adapter of the trained step with the best dev metric so far in
    `<run>/adapter-best-dev`, and what it scored in `<run>/best_dev.json` (step, metric key,
    value, adapter path): the step count chosen on dev, which `train.eval_best_dev` evaluates on
    the test sets next to the last step. Validations before the first step do not count (that
    adapter is the frozen model); a tie keeps the earlier step. The record travels in
    checkpoints, so a resumed run (or one started from another run's checkpoint) compares
    against the best so far, whose adapter may then lie in the other run's directory."""

    def __init__(self, out: Path, metric: str):
        self.out = Path(out)
        self.key = f"val/dev_{metric}"
        self.best: dict[str, Any] | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or trainer.global_step == 0:
            return
        value = trainer.callback_metrics.get(self.key)
        if value is None or (self.best is not None and float(value) <= self.best["value"]):
            return
        adapter = self.out / BEST_DEV_ADAPTER
        self.best = {
            "step": trainer.global_step,
            "metric": self.key,
            "value": float(value),
            "adapter": adapter_name(adapter),
        }
        if trainer.is_global_zero:
            save_adapter(pl_module.policy, adapter)
            write_json(self.out / BEST_DEV_RECORD, self.best)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")
