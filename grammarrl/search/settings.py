"""How mode=search draws, weights and reduces particles, as a typed value built once from the
config's `search` group by the mode's entry point (`SearchSettings.from_config`)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from grammarrl.search.registry import search_method


@dataclass(frozen=True)
class SearchSettings:
    """One search method's settings, with the config's defaults resolved: the potential the
    method pairs with when `search.potential` is null, no resampling unless the method resamples
    (`grammarrl.search.registry`)."""

    method: str  # a registered method: rerank | is | smc
    particles: int  # N per input
    potential: str  # reverse | task | none (`search.potential`, else the method's pairing)
    ess_threshold: float  # resample when ESS < ess_threshold · N; 0: never (rerank, is)
    temperature: float  # the proposal's temperature
    batch_size: int  # prompts decoded together, each with `particles` rows
    posterior_draws: int  # draws for the posterior-weighted metric; 0: skip
    greedy_baseline: bool  # also decode greedily: the cost reference

    @classmethod
    def from_config(cls, search: DictConfig) -> SearchSettings:
        """From the config's `search` group."""
        method = search_method(str(search.method))
        return cls(
            method=method.name,
            particles=int(search.particles),
            potential=str(search.potential or method.potential),
            ess_threshold=float(search.ess_threshold) if method.resamples else 0.0,
            temperature=float(search.temperature),
            batch_size=int(search.batch_size),
            posterior_draws=int(search.posterior_draws),
            greedy_baseline=bool(search.greedy_baseline),
        )
