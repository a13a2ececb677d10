"""`CorpusTask`: what the three tasks share — data loading, split policy, prompt assembly, hints.

A concrete task supplies: how to read and normalise its rows, how to pick its demonstrations,
its vocabulary, its instruction texts and context block, its grammar, parser and metric.

Prompt layout (paper, appendix "Prompts"):
  forward: system = instruction + context block (hints / hierarchy) + output format;
           demonstrations as (user: input, assistant: output) turns; user: query.
  reverse: system = inverse instruction; demonstrations swapped (user: output, assistant: input);
           user: candidate output. No hints.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from grammarrl.config.schema_task import DATA_SOURCES
from grammarrl.data.hints import HintIndex
from grammarrl.data.sources import Row, SkipLog, data_root, fingerprint, relative_uid, task_dir
from grammarrl.data.splits import make_splits
from grammarrl.errors import ConfigError, DataError
from grammarrl.tasks.base import Task
from grammarrl.tasks.settings import TaskSettings
from grammarrl.types import Example, Message, Splits

log = logging.getLogger(__name__)


def clean_text(text: str) -> str:
    """Collapse runs of whitespace (including non-breaking spaces) to single spaces."""
    return " ".join(text.split())


class CorpusTask(Task):
    """A task over a corpus read from `data.dir` (or the samples, or the hub)."""

    data_dir: ClassVar[str]  # its sub-directory of data.dir (the layout of ../shared/data)
    instruction: str  # the fixed task instruction
    output_format: str  # the required output format
    inverse_instruction: str  # the reverse prompt's system instruction

    def __init__(self, settings: TaskSettings) -> None:
        self.settings = settings
        self.source, self.root = self.locate(settings)
        self.seed = settings.split_seed
        self.embedder = settings.embedder
        self.cache_dir = settings.cache_dir
        self.skips = SkipLog(self.name)
        self._splits: Splits | None = None
        self._hints_ready = False

    def locate(self, settings: TaskSettings) -> tuple[str, Path | None]:
        """(source, root) of the task's rows: `data.source`, and when local the data root
        (`data.dir`, or the bundled samples)."""
        if settings.source not in DATA_SOURCES:
            expected = " or ".join(DATA_SOURCES)
            raise ConfigError(f"data.source={settings.source!r} is invalid: expected {expected}")
        return settings.source, data_root(settings.data_dir) if settings.source == "local" else None

    # ----- data -------------------------------------------------------------------------
    @property
    def data_key(self) -> str:
        """Identifies the data this task reads (cache keys)."""
        where = str(self.root.resolve()) if self.root is not None else f"hub:{self.name}"
        return fingerprint(self.name, where)

    def read_rows(self) -> list[Row]:
        """The raw rows from the configured source."""
        if self.source == "hub":
            return self.read_hub()
        return self.read_local(task_dir(self.root, self.data_dir, self.name))

    @abstractmethod
    def read_local(self, directory: Path) -> list[Row]:
        """Read this task's files from its directory under data.dir."""

    def read_hub(self) -> list[Row]:
        """All rows of the task's public Hugging Face dataset (`data.source=hub`)."""
        raise DataError(
            f"task {self.name}: no public hub dataset is known; put its files under "
            f"data.dir/{self.data_dir} and use data.source=local"
        )

    def example_uid(self, row: Row) -> str:
        """The id of the row's example: where it was read, relative to the data directory, so
        that results made on different machines pair up."""
        return relative_uid(row.where, self.root)

    @abstractmethod
    def normalise(self, row: Row) -> Example | None:
        """One row as an Example, or None after reporting why it was skipped."""

    @abstractmethod
    def pick_fewshot(self, pool: list[Example], k: int) -> list[Example]:
        """k fixed, deterministic demonstrations from the training pool."""

    @abstractmethod
    def vocab_size(self) -> int:
        """The size of the closed output vocabulary (terms, spans or label paths)."""

    @cached_property
    def corpus(self) -> dict[str, list[Example]]:
        """Every valid example of the corpus, by source split (train/dev/test, or all)."""
        pools: dict[str, list[Example]] = {}
        rows = self.read_rows()
        for row in rows:
            example = self.normalise(row)
            if example is not None:
                pools.setdefault(row.split, []).append(example)
        log.info(
            "%s: %d rows read, %d kept (%s)",
            self.name,
            len(rows),
            sum(map(len, pools.values())),
            self.skips.as_dict() or "none skipped",
        )
        return pools

    def pools(self) -> dict[str, list[Example]]:
        """The train/dev/test pools the split policy draws from."""
        return {split: self.corpus.get(split, []) for split in ("train", "dev", "test")}

    def splits(self) -> Splits:
        if self._splits is None:
            self._splits = make_splits(
                self.pools(),
                train_size=self.settings.train_size,
                dev_size=self.settings.dev_size,
                num_fewshot=self.settings.num_fewshot,
                pick_fewshot=self.pick_fewshot,
                seed=self.seed,
                skips=self.skips,
                task=self.name,
            )
        return self._splits

    # ----- hints ------------------------------------------------------------------------
    def hint_vocabularies(self) -> dict[str, list[str]]:
        """Named vocabularies hints are retrieved from ({} for a task without hints)."""
        return {}

    def hint_display(self, item: str) -> str:
        """The text embedded for a vocabulary item."""
        return item

    @cached_property
    def hint_index(self) -> HintIndex | None:
        vocabularies = self.hint_vocabularies()
        if not vocabularies or self.settings.num_hints <= 0:
            return None
        return HintIndex(
            self.name,
            vocabularies,
            self.settings.num_hints,
            self.embedder,
            self.cache_dir,
            self.data_key,
            display=self.hint_display,
        )

    def prepare_hints(self) -> int:
        """Compute and cache the hints of every split input; returns how many were new."""
        if self.hint_index is None:
            return 0
        splits = self.splits()
        inputs = [
            ex.input
            for part in (splits.train, splits.dev, splits.fewshot, splits.test_pool)
            for ex in part
        ]
        new = self.hint_index.ensure(inputs)
        self._hints_ready = True
        return new

    def hints(self, example: Example) -> dict[str, list[str]]:
        """The example's hints (all split inputs are computed together on first need)."""
        if self.hint_index is None:
            return {}
        if not self._hints_ready:
            self.prepare_hints()
        return self.hint_index.get(example.input)

    # ----- prompts ----------------------------------------------------------------------
    def context(self, example: Example) -> str:
        """The context block of the forward system prompt ("" for none)."""
        return ""

    def system_prompt(self, example: Example) -> str:
        parts = (self.instruction, self.context(example), self.output_format)
        return "\n\n".join(part for part in parts if part)

    def demonstrations(self) -> list[Example]:
        return self.splits().fewshot

    def forward_messages(self, example: Example) -> list[Message]:
        messages = [{"role": "system", "content": self.system_prompt(example)}]
        for demo in self.demonstrations():
            messages += [
                {"role": "user", "content": demo.input},
                {"role": "assistant", "content": demo.target},
            ]
        return messages + [{"role": "user", "content": example.input}]

    def reverse_messages(self, candidate: str) -> list[Message]:
        messages = [{"role": "system", "content": self.inverse_instruction}]
        for demo in self.demonstrations():
            messages += [
                {"role": "user", "content": demo.target},
                {"role": "assistant", "content": demo.input},
            ]
        return messages + [{"role": "user", "content": candidate}]

    # ----- parsing ----------------------------------------------------------------------
    def try_parse(self, output: str) -> Any | None:
        """The parsed output, or None if it is invalid."""
        try:
            return self.parse(output)
        except ValueError:
            return None
