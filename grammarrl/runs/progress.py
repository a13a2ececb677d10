"""The training progress bars: one bar in optimizer steps with an ETA, one per validation slice.

Lightning's default bar counts batches of an epoch ("Epoch 0/-2 ... 4/2" when training is
bounded by steps); GrammarRL trains for `trainer.max_steps` steps on a step-indexed sampler, so the
bar counts steps, starting where a resumed run left off.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """`train  37/200 [12:03<53:10, 19.6s/step, reward=-14.2, ...]`, and `validate dev 2/3`."""

    @property
    def train_description(self) -> str:
        return "train"

    @property
    def validation_description(self) -> str:
        return "validate"

    def on_train_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_start(trainer)
        self._count_steps(trainer)  # a run resumed mid-epoch gets no on_train_epoch_start

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        self._count_steps(trainer)  # one bar for the run (Lightning's: one per epoch)

    def _count_steps(self, trainer: L.Trainer) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step  # the ETA counts this run's steps only
        bar.unit = "step"
        bar.set_description("train")

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        bar = self.train_progress_bar
        if bar is not None and not bar.disable:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)  # the CSV logger's version folder name: not a metric
        return metrics

    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        super().on_validation_batch_start(trainer, pl_module, batch, batch_idx, dataloader_idx)
        names = getattr(trainer.datamodule, "val_names", None)
        if batch_idx == 0 and names and not trainer.sanity_checking:  # a slice's first batch
            self.val_progress_bar.set_description(f"validate {names[dataloader_idx]}")
