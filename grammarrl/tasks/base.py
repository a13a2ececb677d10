"""The task interface: data splits, forward/reverse chat prompts, grammar, parsing and scoring.

Every task (gloss, wos, conll, custom) implements `Task`. Prompts are chat messages
(`[{"role": "system"|"user"|"assistant", "content": str}, ...]`); the caller applies the
model's chat template. The forward prompt ends with the query as the last user turn; the
reverse prompt ends with a candidate output as the last user turn, and the text to
reconstruct (scored by teacher forcing) is exactly `example.input`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Self

from grammarrl.errors import DataError
from grammarrl.types import Example, Message, Scores, Splits

if TYPE_CHECKING:
    from omegaconf import DictConfig

POOL_ORDER_SEED = 0  # the one shuffle of the test pool that disjoint test sets are cut from


class Task(ABC):
    """One structured-generation task."""

    name: str
    metric_name: str
    table_label: ClassVar[str] = ""  # the aggregator's column header, e.g. "CoNLL (F1-micro)"

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Self:
        """The task of a composed config (`grammarrl.tasks.load_task`): built from its typed
        settings (`grammarrl.tasks.settings.TaskSettings`), never holding the config."""
        from grammarrl.tasks.settings import TaskSettings

        return cls(TaskSettings.from_config(cfg))

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

    def search_penalty(self, example: Example, text: str, complete: bool) -> float:
        """log Φ <= 0 of the task-specific potential of the search baselines
        (`search.potential=task`) for an output prefix (`complete=False`: judge its completed
        units only) or a complete output. Optional: `has_search_penalty` says if defined."""
        raise NotImplementedError(f"task {self.name} defines no search penalty")

    @classmethod
    def has_search_penalty(cls) -> bool:
        """Whether the task defines `search_penalty`."""
        return cls.search_penalty is not Task.search_penalty

    def test_sets(
        self, num_sets: int, size: int, seed: int, drawing: str = "disjoint"
    ) -> list[list[Example]]:
        """`num_sets` test sets of `size` examples from the test pool (`drawing_note` says when
        they cannot be disjoint).

        disjoint: the pool in one fixed shuffled order, cut into slots of `size`; set i of seed
        s takes slot s·num_sets + i, so two (seed, set) pairs never share an example while the
        pool holds both slots (past its end the slots wrap around). seed_plus_index: set i is
        `Random(seed + i).sample(pool, size)`, the drawing of results written before
        2026-11-27 (seed s's set i+1 is seed s+1's set i)."""
        pool = self.splits().test_pool
        if not pool:
            raise DataError(f"task {self.name}: the test pool is empty")
        size = min(size, len(pool))
        if drawing == "seed_plus_index":
            return [random.Random(seed + i).sample(pool, size) for i in range(num_sets)]
        if drawing != "disjoint":
            raise ValueError(f"unknown test set drawing {drawing!r}")
        order = list(pool)
        random.Random(POOL_ORDER_SEED).shuffle(order)
        slots = range(seed * num_sets, (seed + 1) * num_sets)
        return [[order[(slot * size + j) % len(order)] for j in range(size)] for slot in slots]


def drawing_note(num_sets: int, size: int, seed: int, pool_size: int, drawing: str) -> str:
    """Why the test sets of this seed may share examples with each other or with another
    seed's sets ("" when they cannot: the disjoint drawing with every slot inside the pool)."""
    if drawing == "seed_plus_index":
        return (
            "eval.test_set_drawing=seed_plus_index: set i is drawn with Random(seed+i), so the "
            "sets of neighbouring seeds are the same sets; use the disjoint drawing for new work"
        )
    needed = (seed + 1) * num_sets * min(size, pool_size)
    if seed >= 0 and needed <= pool_size:
        return ""
    return (
        f"the test pool holds {pool_size} examples, but seed {seed}'s {num_sets} disjoint sets "
        f"of {min(size, pool_size)} need slots up to example {needed}: they wrap around the "
        "pool and share examples with other sets (with each other, or with lower seeds')"
    )
