"""What a task reads of the config, as a typed value built once (`TaskSettings.from_config`):
where its rows are, how they are split, how prompts are built. Tasks hold these settings, never
the config (a custom task also holds its resolved spec, `custom_spec.CustomSpec`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from grammarrl.data.hints import MINILM

DEFAULT_TEST_FRACTION = 0.5  # a single labelled pool's share for the test pool (WoS)


@dataclass(frozen=True)
class TaskSettings:
    """A task's settings from `data.*`, `task.*` and `cache_dir` (conf/config.yaml documents
    each key)."""

    source: str  # data.source: local | hub
    data_dir: str | None  # data.dir; None: the bundled samples
    split_seed: int  # data.split_seed: draws dev (and WoS's test pool)
    embedder: str  # data.embedder: the hint retriever's sentence embedder
    cache_dir: Path  # cache_dir: hints, prepared data, models
    train_size: int | None  # task.train_size; None: every training row
    dev_size: int  # task.dev_size
    num_fewshot: int  # task.num_fewshot: demonstrations in the prompt
    num_hints: int  # task.num_hints: hints per vocabulary in the prompt (0: none)
    test_fraction: float  # task.test_fraction of a single labelled pool

    @classmethod
    def from_config(cls, cfg: DictConfig) -> TaskSettings:
        """From a composed config (a custom task's after `custom_spec.resolve_spec`)."""
        data, task = cfg.get("data") or {}, cfg.task
        train_size = task.get("train_size")
        fraction = task.get("test_fraction")
        return cls(
            source=str(data.get("source", "local")),
            data_dir=None if data.get("dir") is None else str(data.get("dir")),
            split_seed=int(data.get("split_seed", 0)),
            embedder=str(data.get("embedder") or MINILM),
            cache_dir=Path(str(cfg.cache_dir)),
            train_size=None if train_size is None else int(train_size),
            dev_size=int(task.dev_size),
            num_fewshot=int(task.num_fewshot),
            num_hints=int(task.get("num_hints") or 0),
            test_fraction=DEFAULT_TEST_FRACTION if fraction is None else float(fraction),
        )
