"""The task interface: data splits, forward/reverse chat prompts, grammar, parsing and scoring.

Every task (gloss, wos, conll) implements `Task`. Prompts are chat messages
(`[{"role": "system"|"user"|"assistant", "content": str}, ...]`); the caller applies the
model's chat template. The forward prompt ends with the query as the last user turn; the
reverse prompt ends with a candidate output as the last user turn, and the text to
reconstruct (scored by teacher forcing) is exactly `example.input`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]


@dataclass(frozen=True)
class Example:
    """One normalised example: input text x and gold output y in the grammar's exact form."""

    uid: str
    input: str
    target: str


@dataclass
class Splits:
    """The paper's split policy: train, held-out dev (calibration), few-shot, test pool."""

    train: list[Example]
    dev: list[Example]
    fewshot: list[Example]
    test_pool: list[Example]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped


@dataclass
class Scores:
    """The task metric over a list of predictions, with per-example details."""

    metric: str
    value: float
    per_example: list[dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)
    validity: float = 1.0


class Task(ABC):
    """One structured-generation task."""

    name: str
    metric_name: str

    @abstractmethod
    def splits(self) -> Splits:
        """Load (once) and return the deterministic splits."""

    @abstractmethod
    def grammar(self) -> str:
        """The output grammar as a Lark CFG string (Outlines CFG / llguidance)."""

    @abstractmethod
    def forward_messages(self, example: Example) -> list[Message]:
        """System instruction (+ context block), demonstrations, then the query."""

    @abstractmethod
    def reverse_messages(self, candidate: str) -> list[Message]:
        """Inverse instruction, swapped demonstrations, then the candidate output."""

    @abstractmethod
    def parse(self, output: str) -> Any:
        """Parse an output string; raise ValueError if it is not a valid output."""

    @abstractmethod
    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        """Score predictions against the examples' gold targets."""

    def test_sets(self, num_sets: int, size: int, seed: int) -> list[list[Example]]:
        """`num_sets` test sets of `size` examples from the test pool, set i drawn with seed+i."""
        import random

        pool = self.splits().test_pool
        if not pool:
            from grammarrl.errors import DataError

            raise DataError(f"task {self.name}: the test pool is empty")
        size = min(size, len(pool))
        return [random.Random(seed + i).sample(pool, size) for i in range(num_sets)]
