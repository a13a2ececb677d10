"""The data types tasks and the data layer share: examples, splits, scores, chat messages.

They live here, below both `grammarrl.data` and `grammarrl.tasks`, so that neither imports the
other's package for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}


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
    # the rest of the dev pool in a seeded order: validation slices larger than `dev` take
    # from it (calibration uses `dev` only)
    dev_reserve: list[Example] = field(default_factory=list)


@dataclass
class Scores:
    """The task metric over a list of predictions, with per-example details."""

    metric: str
    value: float
    per_example: list[dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)
    validity: float = 1.0
