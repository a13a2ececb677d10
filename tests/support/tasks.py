"""A toy task for reward and search tests."""

from __future__ import annotations

from grammarrl.tasks.base import Task
from grammarrl.types import Example, Scores, Splits

WORDS = ["alpha", "beta", "gamma", "delta", "omega"]


class ToyTask(Task):
    """Pick one word from a list; the reverse prompt reconstructs the sentence."""

    name = "toy"
    metric_name = "accuracy"

    def __init__(self, words: list[str]):
        self.words = words

    def splits(self) -> Splits:
        raise NotImplementedError

    def grammar(self) -> str:
        return "start: " + " | ".join(f'"{w}"' for w in self.words)

    def forward_messages(self, example: Example) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "Name the topic."},
            {"role": "user", "content": example.input},
        ]

    def reverse_messages(self, candidate: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": "Write a sentence about the topic."},
            {"role": "user", "content": candidate},
        ]

    def parse(self, output: str) -> str:
        return output

    def score(self, predictions: list[str], examples: list[Example]) -> Scores:
        raise NotImplementedError
