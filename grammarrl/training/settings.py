"""What a training step reads from the config, as typed values built once by the mode's entry
point (`StepSettings.from_config`): below it, the step and the Lightning module see only these."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from grammarrl.rl.reward import Mixing
from grammarrl.rl.settings import RolloutSettings
from grammarrl.search.potentials import default_potential


@dataclass(frozen=True)
class AmortisedSettings:
    """`train.objective=amortised_is`: Full IS draws `particles` per prompt at `temperature`
    from `proposal`, weighted by the potential `potential` (`grammarrl.training.amortised`)."""

    particles: int  # search.particles
    potential: str  # search.potential, or the paper's pairing for Full IS
    temperature: float  # search.temperature
    proposal: str  # train.proposal: policy or reference (the frozen model)


@dataclass(frozen=True)
class StepSettings:
    """One training step's settings: the rollout groups, the reward and its mixing (λ, σ's),
    where the KL term acts, the optimiser, and how the policy runs."""

    rollout: RolloutSettings
    reward: str  # reward._target_: the reward class (`grammarrl.rl.reward`)
    mixing: Mixing  # λ and the σ's: (1-λ)·direct/σ_direct + λ·reverse/σ_reverse
    beta: float  # β of the KL term
    kl_penalty: str  # where β's term acts: loss, reward or grammar (`grammarrl.rl.rloo`)
    seed: int  # train.seed: the sampling stream (per rank: seed + rank)
    lr: float  # optim.lr
    weight_decay: float  # optim.weight_decay
    max_new_tokens: int  # task.max_new_tokens
    share_prefix: bool  # train.share_prefix
    gradient_checkpointing: bool  # train.gradient_checkpointing
    policy_dropout: bool  # train.policy_dropout
    pairwise_weight: float  # train.pairwise_weight: the IPO term's weight; 0: off
    pairwise_tau: float  # train.pairwise_tau: IPO's τ (the margin sought is 1/(2τ))
    amortised: AmortisedSettings | None = None  # train.objective=amortised_is; None: RLOO

    @classmethod
    def from_config(
        cls, cfg: DictConfig, sigma_direct: float, sigma_reverse: float
    ) -> StepSettings:
        """The settings of a composed config, with the run's σ's (`resolve_sigmas`)."""
        amortised = None
        if cfg.train.objective == "amortised_is":
            amortised = AmortisedSettings(
                particles=int(cfg.search.particles),
                potential=cfg.search.potential or default_potential("is"),
                temperature=float(cfg.search.temperature),
                proposal=cfg.train.proposal,
            )
        return cls(
            rollout=RolloutSettings.from_config(cfg.rollout),
            reward=cfg.reward._target_,
            mixing=Mixing(cfg["lambda"], sigma_direct, sigma_reverse),
            beta=cfg.beta,
            kl_penalty=cfg.kl_penalty,
            seed=cfg.train.seed,
            lr=cfg.optim.lr,
            weight_decay=cfg.optim.weight_decay,
            max_new_tokens=cfg.task.max_new_tokens,
            share_prefix=cfg.train.share_prefix,
            gradient_checkpointing=cfg.train.gradient_checkpointing,
            policy_dropout=cfg.train.policy_dropout,
            pairwise_weight=float(cfg.train.pairwise_weight),
            pairwise_tau=float(cfg.train.pairwise_tau),
            amortised=amortised,
        )
