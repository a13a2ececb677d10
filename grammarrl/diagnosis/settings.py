"""What mode=diagnose reads from the config, as typed values built once by its entry point
(`DiagnoseSettings.from_config`): below it, decoding, perturbing and judging see only these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from grammarrl.runs.results import config_dict


@dataclass(frozen=True)
class DiagnoseSettings:
    """The `diagnose` group, the sampling it shares with training, and the config record."""

    num_inputs: int  # diagnose.num_inputs: K dev inputs decoded
    num_samples: int  # diagnose.num_samples: M constrained samples per dev input
    num_labelled: int  # diagnose.num_labelled: rows whose gold output is perturbed
    batch_size: int  # diagnose.batch_size: dev inputs decoded together
    lambdas: tuple[float, ...]  # diagnose.lambdas: the reward mixings compared
    min_lift: float  # diagnose.min_lift: a smaller lift is within noise
    blind_below: float  # diagnose.blind_below: a reverse share's interval below it: blind
    bootstrap_draws: int  # diagnose.bootstrap_draws: resamples of the cross-fitted lift
    temperature: float  # rollout.temperature: the samples' temperature, as training's
    seed: (
        int  # seed: the sampling and perturbation streams (the lift's halves and resamples: fixed)
    )
    lam: float  # lambda: the run's configured λ
    reward: str  # reward._target_: the reward whose terms are compared
    model: str  # model.name, as the record names it
    max_new_tokens: int  # task.max_new_tokens
    config: dict[str, Any] = field(repr=False)  # the run's whole config, as the record holds it

    @classmethod
    def from_config(cls, cfg: DictConfig) -> DiagnoseSettings:
        """The settings of a composed config, after `load_task` (a custom task's spec merged
        into `cfg.task`: its `max_new_tokens`, and the config record, include it)."""
        diagnose = cfg.diagnose
        return cls(
            num_inputs=diagnose.num_inputs,
            num_samples=diagnose.num_samples,
            num_labelled=diagnose.num_labelled,
            batch_size=int(diagnose.batch_size),
            lambdas=tuple(float(lam) for lam in diagnose.lambdas),
            min_lift=diagnose.min_lift,
            blind_below=diagnose.blind_below,
            bootstrap_draws=int(diagnose.bootstrap_draws),
            temperature=float(cfg.rollout.temperature),
            seed=int(cfg.seed),
            lam=float(cfg["lambda"]),
            reward=cfg.reward._target_,
            model=cfg.model.name,
            max_new_tokens=cfg.task.max_new_tokens,
            config=config_dict(cfg),
        )

    def record(self) -> dict[str, Any]:
        """The settings a diagnosis record names."""
        return {
            "num_inputs": self.num_inputs,
            "num_labelled": self.num_labelled,
            "num_samples": self.num_samples,
            "min_lift": self.min_lift,
            "blind_below": self.blind_below,
            "bootstrap_draws": self.bootstrap_draws,
            "lambdas": list(self.lambdas),
            "temperature": self.temperature,
            "seed": self.seed,
            "config_lambda": self.lam,
        }
