"""The config's schema: the type of every key (one dataclass per group), the top-level keys,
and the keys that moved. The values, defaults included, live in conf/; `grammarrl.config`
composes and validates against this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


# The schemas give each key its type; the values, defaults included, live in conf/ (the one
# source of truth). A field with a default is one that only some configs of its group set.
@dataclass
class TaskSchema:
    name: str
    metric: str
    train_size: int | None  # null: every training input (custom tasks)
    dev_size: int
    num_fewshot: int
    num_hints: int
    batch_size: int
    max_steps: int
    lr: float
    max_new_tokens: int
    test_fraction: Any = None  # one labelled pool (WoS, custom): the share kept as the test pool
    _target_: Any = None  # the Task class (grammarrl/tasks/__init__.py: the registry)
    sigmas: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # task=custom only (conf/task/custom.yaml documents them; grammarrl/tasks/custom.py)
    spec: Any = None
    train: Any = None
    dev: Any = None
    test: Any = None
    input_field: Any = None
    output_field: Any = None
    demonstrations: Any = None
    json_schema: Any = None
    regex: Any = None
    lark: Any = None
    choices: Any = None
    instruction: Any = None
    output_format: Any = None
    reverse_instruction: Any = None


@dataclass
class ModelSchema:
    name: str
    source: str
    dtype: str
    path: Any = None
    # model=tiny only: the random small Llama's shape and seed
    hidden_size: Any = None
    num_layers: Any = None
    num_heads: Any = None
    intermediate_size: Any = None
    init_seed: Any = None


@dataclass
class RolloutSchema:
    num_samples: int
    beam_width: int
    temperature: float
    length_penalty: float


@dataclass
class LoraSchema:
    r: int
    alpha: int
    dropout: float
    target_modules: list[str]


@dataclass
class OptimSchema:
    lr: float
    weight_decay: float
    batch_size: int


@dataclass
class TrainSchema:
    seed: int
    share_prefix: bool
    gradient_checkpointing: bool
    policy_dropout: bool
    resume: Any
    eval_baseline: bool
    eval_beam: bool
    eval_best_dev: bool
    val_size: int
    val_at_start: bool
    checkpoint_every_n_steps: int


@dataclass
class EvalSchema:
    decoding: str
    beam_width: int
    length_penalty: float
    num_test_sets: int
    test_size: int
    batch_size: int
    adapter: Any
    score_rewards: bool
    test_set_drawing: str
    sampler_seeds: list[int]


@dataclass
class ExportSchema:
    dir: Any


@dataclass
class SearchSchema:
    method: str
    particles: int
    potential: Any
    ess_threshold: float
    temperature: float
    batch_size: int
    posterior_draws: int
    greedy_baseline: bool


@dataclass
class DiagnoseSchema:
    num_inputs: int
    num_labelled: int
    num_samples: int
    lambdas: list[float]
    batch_size: int
    min_lift: float
    blind_below: float


@dataclass
class DataSchema:
    dir: Any
    source: str
    limit_train: Any
    split_seed: int
    embedder: str


@dataclass
class RewardSchema:
    sigma_direct: Any
    sigma_reverse: Any
    calibration_file: str
    calibration_seed: int


@dataclass
class TrainerSchema:
    """The `lightning.pytorch.Trainer` arguments conf/trainer/default.yaml sets (built by
    instantiate); a config may add any other argument but those of `TRAINER_SET`."""

    _target_: str
    accelerator: str
    devices: Any
    strategy: Any
    max_steps: int
    gradient_clip_val: Any
    val_check_interval: Any
    check_val_every_n_epoch: Any
    num_sanity_val_steps: int
    log_every_n_steps: int
    enable_model_summary: bool
    use_distributed_sampler: bool


@dataclass
class LoggerSchema:
    name: str
    # logger=wandb only
    project: Any = None
    mode: Any = None
    group: Any = None
    tags: Any = None


SCHEMAS: dict[str, type] = {
    "task": TaskSchema,
    "model": ModelSchema,
    "rollout": RolloutSchema,
    "lora": LoraSchema,
    "optim": OptimSchema,
    "eval": EvalSchema,
    "train": TrainSchema,
    "search": SearchSchema,
    "diagnose": DiagnoseSchema,
    "export": ExportSchema,
    "data": DataSchema,
    "reward": RewardSchema,
    "trainer": TrainerSchema,
    "logger": LoggerSchema,
}
# Top-level keys that are not config groups.
SCALARS = (
    "mode",
    "lambda",
    "beta",
    "kl_penalty",
    "seed",
    "device",
    "skip_completed",
    "overwrite",
    "cache_dir",
    "callbacks",
)


# Arguments of lightning.pytorch.Trainer that GrammarRL sets itself (grammarrl/train.py
# `build_trainer`), and the key to use instead; `trainer.<name>` may set any other argument.
TRAINER_SET = {
    "logger": "logger=wandb or logger=none (metrics.csv is always written)",
    "default_root_dir": "hydra.run.dir (the run directory)",
    "plugins": "trainer.precision for mixed precision (the checkpoint I/O plugin is GrammarRL's)",
    "enable_checkpointing": "train.checkpoint_every_n_steps (resuming needs the checkpoints)",
}
# Keys that moved (old name -> name now): an override of the old name says where it went, and
# configs recorded before are read under the names of now (`rundir.current_names`).
MOVED = {
    "optim.max_steps": "trainer.max_steps",
    "optim.grad_clip": "trainer.gradient_clip_val",
    "trainer.val_size": "train.val_size",
    "trainer.val_at_start": "train.val_at_start",
    "trainer.checkpoint_every_n_steps": "train.checkpoint_every_n_steps",
    "trainer.callbacks": "callbacks",
}
