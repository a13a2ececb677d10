"""The schema of the groups that shape training: the rollout group, the LoRA adapter, the
optimiser, the reward (its class and σ's), the training loop (`train`, Lightning's `trainer`) and the experiment
tracker (`grammarrl.config.keys` says what a declaration holds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarrl.config.keys import (
    BOOKKEEPING,
    CONTINUABLE,
    NOT_DIAGNOSE,
    ROLLOUTS,
    TRAINING,
    Rule,
    is_int,
    key,
)

OBJECTIVES = ("rloo", "amortised_is")  # train.objective: grammarrl.training.module
PROPOSALS = ("policy", "reference")  # train.proposal: grammarrl.training.amortised
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("offline", "online", "disabled")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


@dataclass
class RolloutSchema:
    num_samples: int = key(
        "N: grammar-constrained samples per input in a rollout group.", at_least=1, modes=ROLLOUTS
    )
    beam_width: int = key(
        "B: the width of the constrained beam whose top-1 joins the group.",
        at_least=1,
        modes=ROLLOUTS,
    )
    temperature: float = key(
        "Sampling temperature of the rollout samples.", above=0, modes=ROLLOUTS
    )
    length_penalty: float = key(
        "The rollout beam ranks finished outputs by sum log-prob / length^length_penalty.",
        modes=ROLLOUTS,
    )


@dataclass
class LoraSchema:
    r: int = key("LoRA rank.", at_least=1, modes=TRAINING)
    alpha: int = key("LoRA scaling α.", modes=TRAINING)
    dropout: float = key(
        "LoRA dropout; acts only with train.policy_dropout=true.",
        at_least=0,
        below=1,
        modes=TRAINING,
    )
    target_modules: list[str] = key("The adapted projections (attention and MLP).", modes=TRAINING)


@dataclass
class OptimSchema:
    lr: float = key("AdamW learning rate.", above=0, modes=TRAINING)
    weight_decay: float = key("AdamW weight decay.", modes=TRAINING)
    batch_size: int = key(
        "Prompts per training step, per process (rank).", at_least=1, modes=ROLLOUTS
    )


@dataclass
class TrainSchema:
    seed: int = key(
        "Seeds training alone (LoRA init, input order, rollout sampling); default: `seed`.",
        modes=TRAINING,
        split_from="seed",
    )
    share_prefix: bool = key(
        "Run each prompt once per phase and share it across its group (speed).",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    gradient_checkpointing: bool = key(
        "Recompute activations in backward: much less memory for about one more forward.",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    policy_dropout: bool = key(
        "LoRA dropout on in the loss's log π_θ pass (plain PEFT training; biases the KL estimate).",
        modes=TRAINING,
    )
    resume: Any = key(
        "`auto`: continue from <run dir>/checkpoints/last.ckpt if there; null; a .ckpt.",
        role=BOOKKEEPING,
        modes=NOT_DIAGNOSE,
    )
    eval_test: bool = key(
        "After training, evaluate on the test sets; false: a dev-only run, the test sets are "
        "never drawn and results.json says no test evaluation ran (refused with "
        "train.eval_beam, eval_baseline or eval_best_dev true).",
        role=CONTINUABLE,
        modes=TRAINING,
        recorded_default=True,
    )
    eval_baseline: bool = key(
        "After training, also evaluate the frozen model and write the frozen-vs-trained summary.",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    eval_beam: bool = key(
        "After training, also evaluate the trained adapter with beam search.",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    eval_best_dev: bool = key(
        "After training, also evaluate the dev-best step's adapter (results_best_dev.json).",
        role=CONTINUABLE,
        modes=TRAINING,
        recorded_default=False,
    )
    val_size: int = key(
        "Inputs per validation slice (a train and a dev slice).",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    val_at_start: bool = key(
        "Validate once before the first step (step 0 of the curves).", modes=TRAINING
    )
    val_train_slice: bool = key(
        "Validate on a slice of training inputs too (the train curves); false: the dev slice only.",
        role=CONTINUABLE,
        modes=TRAINING,
        recorded_default=True,
    )
    checkpoint_every_n_steps: int = key(
        "Write checkpoints/last.ckpt every k steps (for resuming).",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    objective: str = key(
        "`rloo`: RLOO on the bidirectional reward (the paper); `amortised_is`: maximise the "
        "likelihood of Full IS's resampled particles (search.particles, search.potential).",
        choices=OBJECTIVES,
        modes=TRAINING,
        recorded_default="rloo",
    )
    proposal: str = key(
        "`amortised_is`: what draws the particles. `policy`: the current policy (proposal and "
        "policy iterate); `reference`: the frozen model, so the targets are those of Full IS "
        "with the frozen proposal (mode=search search.method=is), a fixed distribution.",
        choices=PROPOSALS,
        modes=TRAINING,
        recorded_default="policy",
    )
    pairwise_weight: float = key(
        "RLOO plus this weight times an IPO loss of each group's highest- against its "
        "lowest-reward candidate (log-ratios against π_ref; grammarrl/rl/preference.py); 0: off.",
        at_least=0,
        modes=TRAINING,
        recorded_default=0.0,
    )
    pairwise_tau: float = key(
        "IPO's τ for train.pairwise_weight: the best-minus-worst log-ratio margin sought is "
        "1/(2τ).",
        above=0,
        modes=TRAINING,
        recorded_default=0.1,
    )
    init_adapter: Any = key(
        "A saved PEFT adapter directory to start training from; null: a fresh LoRA adapter.",
        modes=NOT_DIAGNOSE,
        recorded_default=None,
    )


REWARD_MODES = ("train", "eval", "calibrate", "search", "diagnose")  # modes that score rewards
DEFAULT_REWARD = "grammarrl.rl.reward.BidirectionalReward"  # conf/reward/bidirectional.yaml


@dataclass
class RewardSchema:
    _target_: str = key(
        "The reward class (a grammarrl.rl.reward.Reward): `reward=bidirectional` (the paper's) "
        "or `reward=length_normalised`; docs/rewards.md adds one.",
        modes=REWARD_MODES,
        recorded_default=DEFAULT_REWARD,
    )
    sigma_direct: float | None = key(
        "σ_direct by hand, with sigma_reverse (both or neither); null: calibration file, then "
        "the task's σ table, else calibrate first.",
        above=0,
        modes=ROLLOUTS,
    )
    sigma_reverse: float | None = key(
        "σ_reverse by hand, with sigma_direct (both or neither).", above=0, modes=ROLLOUTS
    )
    # A training run's σ's travel in its checkpoint: how calibration finds them does not matter.
    calibration_file: str = key(
        "The calibrated σ's, keyed by task, model and nN_bB.",
        role=CONTINUABLE,
        modes=ROLLOUTS,
    )
    calibration_seed: int = key(
        "Seeds the samples calibration measures the σ's on (apart from `seed`).",
        role=CONTINUABLE,
        split_from="seed",
        modes=ROLLOUTS,
    )


@dataclass
class TrainerSchema:
    """The `lightning.pytorch.Trainer` arguments conf/trainer/default.yaml sets (built by
    instantiate), and those a config may add only with a value GrammarRL supports
    (`accumulate_grad_batches`); a config may add any other argument but those of
    `TRAINER_SET`."""

    _target_: str = key("The Trainer class, built by hydra.utils.instantiate.", modes=TRAINING)
    accelerator: str = key(
        "`auto` follows `device`; any other value must agree with it.",
        choices=ACCELERATORS,
        modes=TRAINING,
    )
    devices: int = key("Processes (ranks); > 1 trains with DDP.", at_least=1, modes=TRAINING)
    strategy: Any = key("Lightning's strategy (`auto`, `ddp`, ...).", modes=TRAINING)
    max_steps: int = key("Training steps.", at_least=1, role=CONTINUABLE, modes=TRAINING)
    gradient_clip_val: Any = key("Gradient norm clipping; null: none.", modes=TRAINING)
    val_check_interval: Any = key(
        "Validate (greedy, train and dev slices) every k training steps.",
        role=CONTINUABLE,
        modes=TRAINING,
    )
    check_val_every_n_epoch: Any = key(
        "null: validation is scheduled by steps alone.", modes=TRAINING
    )
    num_sanity_val_steps: int = key(
        "Lightning's sanity validation batches before training.", modes=TRAINING
    )
    log_every_n_steps: int = key("Log metrics every k steps.", role=CONTINUABLE, modes=TRAINING)
    enable_model_summary: bool = key(
        "Print Lightning's model summary.", role=CONTINUABLE, modes=TRAINING
    )
    use_distributed_sampler: bool = key(
        "false: the step-indexed batch sampler already splits the inputs by rank.",
        modes=TRAINING,
    )
    accumulate_grad_batches: Any = key(
        "Left at 1: an optimizer step trains on one batch (optim.batch_size prompts).",
        rule=Rule(
            lambda value: is_int(value) and value == 1,
            "1: the step-indexed batch sampler gives each optimizer step one batch (more would "
            "replay batches and resume at the wrong one); raise optim.batch_size instead",
        ),
        modes=TRAINING,
        default=1,
    )


@dataclass
class LoggerSchema:
    name: str = key(
        "Experiment tracking: W&B, or none (metrics.csv is always written).",
        choices=LOGGERS,
        role=BOOKKEEPING,
    )
    # logger=wandb only
    project: Any = key("logger=wandb: the W&B project.", role=BOOKKEEPING, default=None)
    mode: str | None = key(
        "logger=wandb: offline (no account; `wandb sync` later), online or disabled.",
        choices=LOGGER_MODES,
        role=BOOKKEEPING,
        default=None,
    )
    group: Any = key(
        "logger=wandb: the W&B group; null: one group per sweep.", role=BOOKKEEPING, default=None
    )
    tags: Any = key(
        "logger=wandb: extra tags (task, model, mode, λ, N, B are added).",
        role=BOOKKEEPING,
        default=None,
    )
