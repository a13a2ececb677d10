"""Expensive potentials Phi_exp for the inference-time methods (paper appendix "Baselines").

Every potential returns log Phi <= 0 (or any real for the reverse likelihood):

- `reverse`: the noisy-channel likelihood log pi_ref(x | tau(y)) = SUM over the tokens of x of
  log pi_ref(x_k | tau(y), x_<k), teacher-forced on the reverse prompt with no grammar mask, under
  the frozen reference (adapter disabled), on complete outputs only: the reverse pass of the
  run's reward (`grammarrl.rl.reward.Reward`), whose static prompt part is computed once. Unit
  exponent, no scale.
- `task`: the task-specific soft penalties of the paper's Table "task-specific potentials",
  judged on completed units of prefixes and on the complete output: each task's
  `search_penalty` (grammarrl/tasks/conll.py, grammarrl/tasks/gloss.py). WoS has none (its
  grammar already enforces the vocabularies and the hierarchy).
- `none`: Phi = 1 (the target is the grammar posterior p(y | x, G)).

A potential is bound to the examples of one decoding call (`bind`) to serve as the decoder's
`Twist`; values are memoised per (example, text).
"""

from __future__ import annotations

from grammarrl.errors import ConfigError
from grammarrl.rl.reward import Reward
from grammarrl.search.registry import search_method
from grammarrl.tasks.base import Task
from grammarrl.types import Example

POTENTIALS = ("reverse", "task", "none")


class Potential:
    """log Phi on prefixes (`prefix`) and on complete outputs (`complete`, batched per example)."""

    name = "none"
    on_prefix = False  # evaluated after every token (SMC twist) or only at completion

    def prefix(self, example: Example, text: str) -> float:
        return 0.0

    def complete(self, example: Example, texts: list[str]) -> list[float]:
        return [0.0] * len(texts)

    # cost accounting (model forward token positions run by the potential)
    forward_tokens = 0
    forward_calls = 0

    def bind(self, examples: list[Example]) -> BoundPotential:
        return BoundPotential(self, examples)


class BoundPotential:
    """A potential over the prompts of one decoding call (prompt index -> example): the
    decoder's `Twist`, memoised per (prompt, text)."""

    def __init__(self, potential: Potential, examples: list[Example]):
        self.potential = potential
        self.examples = examples
        self.on_prefix = potential.on_prefix
        self._prefix: dict[tuple[int, str], float] = {}
        self._complete: dict[tuple[int, str], float] = {}

    def prefix(self, prompt: int, text: str) -> float:
        key = (prompt, text)
        if key not in self._prefix:
            self._prefix[key] = float(self.potential.prefix(self.examples[prompt], text))
        return self._prefix[key]

    def complete(self, prompt: int, texts: list[str]) -> list[float]:
        todo = list(dict.fromkeys(t for t in texts if (prompt, t) not in self._complete))
        if todo:
            values = self.potential.complete(self.examples[prompt], todo)
            for text, value in zip(todo, values):
                self._complete[(prompt, text)] = float(value)
        return [self._complete[(prompt, t)] for t in texts]


# ---------------------------------------------------------------------- reverse likelihood


class ReversePotential(Potential):
    """log pi_ref(x | tau(y)), summed over the tokens of x: the reward's reverse pass before its
    mean (`ReferenceScorer.reverse_logprobs`)."""

    name = "reverse"

    def __init__(self, reward: Reward, batch_size: int = 16):
        self.scorer = reward.scorer
        self.batch_size = int(batch_size)
        self.forward_tokens = 0
        self.forward_calls = 0

    def complete(self, example: Example, texts: list[str]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            logps, positions = self.scorer.reverse_logprobs(
                example, texts[start : start + self.batch_size]
            )
            self.forward_calls += 1
            self.forward_tokens += positions
            out.extend(float(lp.sum()) for lp in logps)
        return out


# ---------------------------------------------------------------------- task-specific


class TaskPotential(Potential):
    """The task's own soft penalties (`Task.search_penalty`), on prefixes and complete outputs."""

    name = "task"
    on_prefix = True

    def __init__(self, task: Task):
        self.task = task

    def prefix(self, example: Example, text: str) -> float:
        return self.task.search_penalty(example, text, complete=False)

    def complete(self, example: Example, texts: list[str]) -> list[float]:
        return [self.task.search_penalty(example, t, complete=True) for t in texts]


# ---------------------------------------------------------------------- factory


def default_potential(method: str) -> str:
    """The potential the search method pairs with (the paper's: reverse for Sample-Rerank and
    Full IS, task for Full SMC)."""
    return search_method(method).potential


def make_potential(name: str, task: Task, reward: Reward | None = None) -> Potential:
    """The potential `name`; `reverse` runs the reverse pass of `reward`."""
    if name == "none":
        return Potential()
    if name == "task":
        if not task.has_search_penalty():
            raise ConfigError(
                f"search.potential=task: task {task.name} has no task-specific potential (the "
                "paper defines them for conll and gloss); use search.potential=reverse or none"
            )
        return TaskPotential(task)
    if name == "reverse":
        if reward is None:
            raise ValueError("search.potential=reverse: no reward whose reverse pass to run")
        return ReversePotential(reward)
    raise ConfigError(f"search.potential={name!r}: expected one of {', '.join(POTENTIALS)}")
