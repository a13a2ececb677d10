"""Lightning DataModule: prompts per step from the training split; greedy validation slices."""

from __future__ import annotations

import lightning as L
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from grammarrl.tasks.base import Example, Task


def _as_list(batch: list[Example]) -> list[Example]:
    return batch


class GrammarRLDataModule(L.LightningDataModule):
    """Training inputs (labels unused by training) and two validation slices: train and dev."""

    val_names = ("train", "dev")

    def __init__(self, cfg: DictConfig, task: Task):
        super().__init__()
        self.cfg = cfg
        self.task = task

    def setup(self, stage: str | None = None) -> None:
        splits = self.task.splits()
        limit = self.cfg.data.limit_train
        self.train = splits.train[:limit] if limit else splits.train
        size = self.cfg.trainer.val_size
        self.val = (self.train[:size], splits.dev[:size])

    def transfer_batch_to_device(self, batch: list[Example], device, dataloader_idx: int):
        return batch  # text examples: tokenised and moved by the decoder and scorer

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.cfg.seed)
        return DataLoader(self.train, batch_size=self.cfg.optim.batch_size, shuffle=True,
                          generator=generator, collate_fn=_as_list, drop_last=False)

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(v, batch_size=self.cfg.eval.batch_size, collate_fn=_as_list)
                for v in self.val]
