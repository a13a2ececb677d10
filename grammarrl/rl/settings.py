"""How rollout groups are drawn, as a typed value built once from the config's `rollout` group
(light: no model code, so that calibration's pre-flight check imports nothing heavy)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig


@dataclass(frozen=True)
class RolloutSettings:
    """How a rollout group is drawn (the `rollout` group): N samples at a temperature, and the
    top-1 of a beam of width B ranking by sum log-prob / length^length_penalty."""

    num_samples: int
    beam_width: int
    temperature: float
    length_penalty: float

    @classmethod
    def from_config(cls, rollout: DictConfig) -> RolloutSettings:
        """From the config's `rollout` group."""
        return cls(
            num_samples=rollout.num_samples,
            beam_width=rollout.beam_width,
            temperature=rollout.temperature,
            length_penalty=rollout.length_penalty,
        )
