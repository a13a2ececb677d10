"""Lightning DataModule: prompts per step from the training split; greedy validation slices."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import lightning as L
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Sampler

from grammarrl.errors import DataError
from grammarrl.tasks.base import Task
from grammarrl.types import Example

log = logging.getLogger(__name__)


def _as_list(batch: list[Example]) -> list[Example]:
    return batch


class StepBatchSampler(Sampler[list[int]]):
    """Training batches indexed by optimizer step, so that a resumed run sees exactly the batches
    an uninterrupted run would.

    Pass p over the training set is a permutation drawn with seed + p, cut into batches of
    `batch_size` (the last batch of a pass may be smaller); with several ranks, step s of rank r
    takes batch s * world_size + r. Iteration starts at step `start` (the restored global step)
    and the length is the whole run (`num_steps`), so Lightning sees one epoch.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        seed: int,
        num_steps: int,
        start: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if size < 1:
            raise ValueError("the training set is empty")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.num_steps, self.start = num_steps, start
        self.rank, self.world_size = rank, world_size
        self.per_pass = math.ceil(size / batch_size)
        self._perm: tuple[int, list[int]] | None = None

    def batch(self, step: int) -> list[int]:
        """The example indices of `step` on this rank."""
        p, j = divmod(step * self.world_size + self.rank, self.per_pass)
        if self._perm is None or self._perm[0] != p:
            gen = torch.Generator().manual_seed(self.seed + p)
            self._perm = (p, torch.randperm(self.size, generator=gen).tolist())
        return self._perm[1][j * self.batch_size : (j + 1) * self.batch_size]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.num_steps):
            yield self.batch(step)

    def __len__(self) -> int:
        return self.num_steps


@dataclass(frozen=True)
class DataSettings:
    """How training batches and validation slices are drawn (`from_config`)."""

    batch_size: int  # optim.batch_size: prompts per step and rank
    max_steps: int  # trainer.max_steps: the sampler's length
    seed: int  # train.seed: the order of the training inputs
    val_size: int  # train.val_size: inputs per validation slice
    val_batch_size: int  # eval.batch_size: validation inputs decoded together
    val_train_slice: bool  # train.val_train_slice: validate on training inputs too
    limit_train: int | None = None  # data.limit_train: cap on training inputs

    @classmethod
    def from_config(cls, cfg: DictConfig) -> DataSettings:
        """The settings of a composed config."""
        return cls(
            batch_size=cfg.optim.batch_size,
            max_steps=cfg.trainer.max_steps,
            seed=cfg.train.seed,
            val_size=cfg.train.val_size,
            val_batch_size=cfg.eval.batch_size,
            val_train_slice=cfg.train.val_train_slice,
            limit_train=cfg.data.limit_train,
        )


class GrammarRLDataModule(L.LightningDataModule):
    """Training inputs (labels unused by training) and the validation slices: dev, and a train
    slice unless `train.val_train_slice=false` (`val_names`)."""

    def __init__(self, task: Task, settings: DataSettings):
        super().__init__()
        self.settings = settings
        self.task = task
        self.val_names = ("train", "dev") if settings.val_train_slice else ("dev",)

    def setup(self, stage: str | None = None) -> None:
        splits = self.task.splits()
        limit = self.settings.limit_train
        self.train = splits.train[:limit] if limit else splits.train
        if not self.train:
            raise DataError(f"task {self.task.name}: the training split is empty")
        size = self.settings.val_size
        dev = (splits.dev + splits.dev_reserve)[:size]
        from_split = min(len(splits.dev), len(dev))
        log.info(
            "task %s: dev validation slice %d inputs (%d of the dev split, %d more of the dev pool)",
            self.task.name,
            len(dev),
            from_split,
            len(dev) - from_split,
        )
        if len(dev) < size:
            log.warning(
                "task %s: train.val_size=%d, but the dev split holds %d inputs: the dev "
                "validation slice is all of them (a choice made on it is noisier)",
                self.task.name,
                size,
                len(dev),
            )
        self.val = (self.train[:size], dev) if self.settings.val_train_slice else (dev,)

    def transfer_batch_to_device(self, batch: list[Example], device, dataloader_idx: int):
        return batch  # text examples: tokenised and moved by the decoder and scorer

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        sampler = StepBatchSampler(
            len(self.train),
            self.settings.batch_size,
            self.settings.seed,
            self.settings.max_steps,
            start=trainer.global_step if trainer is not None else 0,  # restored when resuming
            rank=trainer.global_rank if trainer is not None else 0,
            world_size=trainer.world_size if trainer is not None else 1,
        )
        # Own generator: creating the iterator must not draw from the global RNG (resume equality).
        return DataLoader(
            self.train,
            batch_sampler=sampler,
            collate_fn=_as_list,
            generator=torch.Generator().manual_seed(self.settings.seed),
        )

    def val_dataloader(self) -> list[DataLoader]:
        # Own generators: validation between steps must not draw from the global RNG (which the
        # next step's LoRA dropout uses), or a resumed run would diverge.
        return [
            DataLoader(
                v,
                batch_size=self.settings.val_batch_size,
                collate_fn=_as_list,
                generator=torch.Generator().manual_seed(self.settings.seed),
            )
            for v in self.val
        ]
