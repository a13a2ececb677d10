"""The config's schema: every key declared once, with its type, allowed values, description and
role (`grammarrl.config.keys.Key`): the top-level keys here, one dataclass per group in
`schema_task`, `schema_training` and `schema_evaluation`. The values, defaults included, live in
conf/. Derived from it: validation (`grammarrl.config.checks`), which keys a run record compares
and a resume may change (`grammarrl.config.roles`, used by `grammarrl.runs.rundir`) and the docs'
config reference (`grammarrl.config.reference`). Also here: the Trainer arguments GrammarRL sets
itself and the keys that moved."""

from __future__ import annotations

from grammarrl.config.keys import (
    BOOKKEEPING,
    CONTINUABLE,
    MODES,
    NOT_DIAGNOSE,
    TRAINING,
    UNRECORDED,
    Key,
    Rule,
)
from grammarrl.config.schema_evaluation import (
    DiagnoseSchema,
    EvalSchema,
    ExportSchema,
    SearchSchema,
)
from grammarrl.config.schema_task import DataSchema, ModelSchema, TaskSchema
from grammarrl.config.schema_training import (
    LoggerSchema,
    LoraSchema,
    OptimSchema,
    RewardSchema,
    RolloutSchema,
    TrainerSchema,
    TrainSchema,
)

KL_PENALTIES = ("loss", "reward", "grammar")  # where beta's term enters: grammarrl.rl.rloo

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


def _device(value: object) -> bool:
    device = str(value)
    return device in ("auto", "cpu", "cuda") or (
        device.startswith("cuda:") and device[5:].isdigit()
    )


# Top-level keys that are not config groups (no dataclass types them: `type` says their type).
SCALARS: dict[str, Key] = {
    "mode": Key("What the job does.", choices=MODES, type="str"),
    "lambda": Key(
        "Reward mixing: (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse, in [0, 1].",
        type="float",
        at_least=0,
        at_most=1,
        modes=("train", "diagnose", *UNRECORDED),
    ),
    "beta": Key("KL coefficient β.", type="float", at_least=0, modes=TRAINING),
    "kl_penalty": Key(
        "Where β's term acts: `loss` (the paper's Eq. 8), `reward` (subtracted before RLOO) or "
        "`grammar` (β·(log q_θ − log π_ref) subtracted from the reward).",
        choices=KL_PENALTIES,
        type="str",
        modes=TRAINING,
        recorded_default="loss",
    ),
    "seed": Key(
        "Seeds the test-set draws, and training unless train.seed is set.",
        type="int",
        modes=("train", "eval", "search", "diagnose", *UNRECORDED),
    ),
    "device": Key(
        "`auto` (CUDA if present), `cpu`, `cuda` or `cuda:N`.",
        type="str",
        rule=Rule(_device, "auto, cpu, cuda or cuda:N"),
    ),
    "skip_completed": Key(
        "Skip a job whose run directory holds its results under the same settings.",
        type="bool",
        role=BOOKKEEPING,
    ),
    "overwrite": Key(
        "Replace outputs a run directory holds from other settings (else refused).",
        type="bool",
        role=BOOKKEEPING,
    ),
    # A training run's σ's travel in its checkpoint: where the cache lives does not matter.
    "cache_dir": Key(
        "Model cache, hints and calibration file; default $GRAMMARRL_CACHE_DIR or "
        "~/.cache/grammarrl.",
        type="str",
        role=CONTINUABLE,
    ),
    "callbacks": Key(
        "Extra Lightning callbacks by name: `{name: {_target_: module.Class, ...}}`.",
        type="dict",
        modes=NOT_DIAGNOSE,
        recorded_default={},
    ),
}


# Arguments of lightning.pytorch.Trainer that GrammarRL sets itself (grammarrl/training/train.py
# `build_trainer`), and the key to use instead; `trainer.<name>` may set any other argument.
TRAINER_SET = {
    "logger": "logger=wandb or logger=none (metrics.csv is always written)",
    "default_root_dir": "hydra.run.dir (the run directory)",
    "plugins": "trainer.precision for mixed precision (the checkpoint I/O plugin is GrammarRL's)",
    "enable_checkpointing": "train.checkpoint_every_n_steps (resuming needs the checkpoints)",
    "callbacks": "callbacks (the top-level group: callbacks.<name>._target_)",
}
# Keys that moved (old name -> name now): an override of the old name says where it went, and
# configs recorded before are read under the names of now (`rundir.current_names`).
MOVED = {
    "optim.max_steps": "trainer.max_steps",
    "optim.grad_clip": "trainer.gradient_clip_val",
    "trainer.val_size": "train.val_size",
    "trainer.val_at_start": "train.val_at_start",
    "trainer.checkpoint_every_n_steps": "train.checkpoint_every_n_steps",
}
