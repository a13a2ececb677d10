"""What a scoring job (mode=eval, mode=search, a training run's test evaluations) reads from the
config, as typed values built once by the mode's entry point (`EvalSettings.from_config`):
below it, drawing, decoding and recording the test sets see only these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from grammarrl.runs.results import config_dict


@dataclass(frozen=True)
class TestSetSpec:
    """Which seeded test sets are drawn from the task's test pool."""

    __test__ = False  # not a pytest test class

    num_test_sets: int  # eval.num_test_sets
    test_size: int  # eval.test_size: examples per set (capped by the pool)
    seed: int  # seed: the first set's seed
    drawing: str  # eval.test_set_drawing: disjoint | seed_plus_index

    @classmethod
    def from_config(cls, cfg: DictConfig) -> TestSetSpec:
        """The test sets of a composed config."""
        return cls(
            num_test_sets=cfg.eval.num_test_sets,
            test_size=cfg.eval.test_size,
            seed=cfg.seed,
            drawing=cfg.eval.test_set_drawing,
        )


@dataclass(frozen=True)
class EvalSettings:
    """The test sets, how they are decoded and scored, and what their results record names."""

    test_sets: TestSetSpec
    model: str  # model.name, as results name it
    max_new_tokens: int  # task.max_new_tokens
    batch_size: int  # eval.batch_size: prompts decoded together
    beam_width: int  # eval.beam_width
    length_penalty: float  # eval.length_penalty
    score_rewards: bool  # eval.score_rewards: the reference's rewards of every output
    reward: str  # reward._target_: the reward they are scored with
    sampler_seeds: tuple[int, ...]  # eval.sampler_seeds: mode=search's draws
    config: dict[str, Any] = field(repr=False)  # the run's whole config, as results record it

    @classmethod
    def from_config(cls, cfg: DictConfig) -> EvalSettings:
        """The settings of a composed config, after `load_task` (a custom task's spec merged
        into `cfg.task`: its `max_new_tokens`, and the config record, include it)."""
        return cls(
            test_sets=TestSetSpec.from_config(cfg),
            model=cfg.model.name,
            max_new_tokens=cfg.task.max_new_tokens,
            batch_size=cfg.eval.batch_size,
            beam_width=cfg.eval.beam_width,
            length_penalty=cfg.eval.length_penalty,
            score_rewards=bool(cfg.eval.score_rewards),
            reward=cfg.reward._target_,
            # mode=search's draws; greedy and beam are deterministic and never read them
            sampler_seeds=(
                tuple(int(seed) for seed in cfg.eval.sampler_seeds) if cfg.mode == "search" else ()
            ),
            config=config_dict(cfg),
        )
