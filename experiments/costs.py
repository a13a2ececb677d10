"""What a system costs: model forward token positions per output, read from its results files
(`grammarrl.evaluation.costs` records them; a search's counts are one draw's) and pooled over
the files a comparison pools into the system. Results files older than the counts (greedy and
beam evaluations before them) have none: the system's cost is then unknown, never a guess."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from experiments.runs import Evaluation

UNKNOWN = "n/a"


@dataclass(frozen=True)
class FileCost:
    """One results file's forward token positions over its distinct outputs (one draw)."""

    outputs: int
    generation: int
    potential: int  # a search's potential (0 for greedy and beam)
    rewards: int | None  # the eval.score_rewards pass (None: not recorded)


def file_cost(ev: Evaluation) -> FileCost | None:
    """The counts of a results file; None when it records none."""
    results = ev.results
    generation, outputs = results.get("forward_tokens"), results.get("num_unique_examples")
    if not isinstance(generation, int) or not isinstance(outputs, int) or outputs <= 0:
        return None
    rewards = results.get("reward_forward_tokens")
    return FileCost(
        outputs,
        generation,
        int(results.get("potential_forward_tokens") or 0),
        rewards if isinstance(rewards, int) else None,
    )


def pooled_cost(costs: Iterable[FileCost | None]) -> dict[str, Any] | None:
    """Forward token positions per output over every file of a system (their summed counts over
    their summed outputs): `tokens_per_output` = generation + potential, each apart, and the
    reward-scoring pass (a measurement, not counted in the cost; None where a file lacks it).
    None when any file records no counts."""
    found = list(costs)
    if not found or any(c is None for c in found):
        return None
    outputs = sum(c.outputs for c in found)
    generation = sum(c.generation for c in found) / outputs
    potential = sum(c.potential for c in found) / outputs
    rewards = [c.rewards for c in found]
    return {
        "tokens_per_output": generation + potential,
        "generation_per_output": generation,
        "potential_per_output": potential,
        "reward_scoring_per_output": (
            None if None in rewards else sum(r for r in rewards if r is not None) / outputs
        ),
        "outputs": outputs,
        "files": len(found),
    }


def cost_text(cost: dict[str, Any] | None) -> str:
    """A table cell: forward tokens per output, "n/a" when unknown."""
    return UNKNOWN if cost is None else f"{cost['tokens_per_output']:,.0f}"
