"""The config's schema: every key's type and one-line description (one dataclass per group),
the top-level keys, the allowed values of keys that take one of a fixed set, and the keys that
moved. The values, defaults included, live in conf/; `grammarrl.config.checks` composes and validates
against this, and `grammarrl.config.reference` writes the docs' config reference from it."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any

# Allowed values of the keys that take one of a fixed set (checked by `grammarrl.config.checks`).
MODES = ("train", "eval", "calibrate", "search", "diagnose", "prepare", "export")
ADAPTER_MODES = ("eval", "search", "export")  # modes that load eval.adapter
MODEL_SOURCES = ("hub", "embedded", "tiny")
KL_PENALTIES = ("loss", "reward", "grammar")  # where beta's term enters: grammarrl.rl.rloo
DECODINGS = ("greedy", "beam")
TEST_SET_DRAWINGS = ("disjoint", "seed_plus_index")
SEARCH_METHODS = ("rerank", "is", "smc")
OBJECTIVES = ("rloo", "amortised_is")  # train.objective: grammarrl.training.module
SEARCH_POTENTIALS = ("reverse", "task", "none")
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("offline", "online", "disabled")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda")


@dataclass(frozen=True)
class Key:
    """What the schema declares about one config key besides its value: a one-line
    description, the allowed values where they are a fixed set, and (top-level keys only,
    which have no dataclass field) the type."""

    description: str
    choices: tuple[str, ...] | None = None
    type: str | None = None


def key(
    description: str,
    *,
    choices: tuple[str, ...] | None = None,
    default: Any = MISSING,
    default_factory: Any = MISSING,
) -> Any:
    """A schema field carrying its `Key` (read back with `key_of`). `default` or
    `default_factory` only where some configs of the group leave the key out."""
    metadata = {"grammarrl": Key(description, choices)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def key_of(schema_field: Any) -> Key | None:
    """The `Key` a dataclass field was declared with, or None (an undescribed field)."""
    return schema_field.metadata.get("grammarrl")


@dataclass
class TaskSchema:
    name: str = key("The task's name in results, logs, run directories and calibration keys.")
    metric: str = key(
        "The test metric: fixed per built-in task; for task=custom `auto`, `exact_match`, "
        "`accuracy`, `json_fields_f1` or `bleu` (auto: chosen by the constraint)."
    )
    train_size: int | None = key("Training inputs used; null: every training input.")
    dev_size: int = key("Held-out dev inputs that calibrate the σ's.")
    num_fewshot: int = key("Demonstrations in each prompt.")
    num_hints: int = key("Retrieved hints per prompt (gloss terms, CoNLL spans per type); 0: none.")
    batch_size: int = key("The task's prompts per training step (the default of optim.batch_size).")
    max_steps: int = key("The task's training steps (the default of trainer.max_steps).")
    lr: float = key("The task's learning rate (the default of optim.lr).")
    max_new_tokens: int = key(
        "Cap on generated tokens per output; longer ones are flagged truncated."
    )
    test_fraction: Any = key(
        "One labelled pool (WoS, custom without a test file): the share kept as the test pool.",
        default=None,
    )
    _target_: Any = key(
        "The task class; its config file registers the task (grammarrl/tasks/__init__.py).",
        default=None,
    )
    sigmas: dict[str, dict[str, list[float]]] = key(
        "The paper's σ table: model -> `nN_bB` -> [σ_direct, σ_reverse]; {}: calibrate.",
        default_factory=dict,
    )
    # task=custom only (conf/task/custom.yaml documents them; grammarrl/tasks/custom.py)
    spec: Any = key("task=custom: a YAML file holding any of the task's keys.", default=None)
    train: Any = key("task=custom: the training file (JSONL, CSV or TSV); required.", default=None)
    dev: Any = key("task=custom: calibration inputs; null: held out of train.", default=None)
    test: Any = key(
        "task=custom: labelled test rows; null: task.test_fraction of train's labelled rows.",
        default=None,
    )
    input_field: Any = key("task=custom: the field holding the input text.", default=None)
    output_field: Any = key(
        "task=custom: the field holding a gold output (a row without one is unlabelled).",
        default=None,
    )
    demonstrations: Any = key(
        "task=custom: a file of labelled rows for the prompt; null: the first labelled train rows.",
        default=None,
    )
    json_schema: Any = key(
        "task=custom constraint: a JSON schema (inline or a .json file).", default=None
    )
    regex: Any = key(
        "task=custom constraint: a regular expression the whole output matches.", default=None
    )
    lark: Any = key(
        "task=custom constraint: a Lark grammar (llguidance's dialect; inline or a .lark file).",
        default=None,
    )
    choices: Any = key(
        "task=custom constraint: a list of strings, the output is exactly one.", default=None
    )
    instruction: Any = key(
        "task=custom: the system instruction of the forward prompt; required.", default=None
    )
    output_format: Any = key(
        "task=custom: the line after the instruction; null: derived from the constraint; '': none.",
        default=None,
    )
    reverse_instruction: Any = key(
        "task=custom: the instruction of the reverse prompt; null: a generic reconstruction one.",
        default=None,
    )


@dataclass
class ModelSchema:
    name: str = key("The model's name in results, logs and run directories.")
    source: str = key(
        "Where the weights come from: the hub (or a local folder), the embedded SmolLM2 package, "
        "or a random tiny model.",
        choices=MODEL_SOURCES,
    )
    dtype: str = key(
        "`auto` (bfloat16 on CUDA and CPUs with native bf16, else float32) or a torch dtype name."
    )
    path: Any = key(
        "A hub id or a local model folder (source=hub), the GGUF (embedded).", default=None
    )
    # model=tiny only: the random small Llama's shape and seed
    hidden_size: Any = key("model=tiny: hidden size of the random Llama.", default=None)
    num_layers: Any = key("model=tiny: its layers.", default=None)
    num_heads: Any = key("model=tiny: its attention heads.", default=None)
    intermediate_size: Any = key("model=tiny: its MLP width.", default=None)
    init_seed: Any = key("model=tiny: the seed of its random weights.", default=None)


@dataclass
class RolloutSchema:
    num_samples: int = key("N: grammar-constrained samples per input in a rollout group.")
    beam_width: int = key("B: the width of the constrained beam whose top-1 joins the group.")
    temperature: float = key("Sampling temperature of the rollout samples.")
    length_penalty: float = key(
        "The rollout beam ranks finished outputs by sum log-prob / length^length_penalty."
    )


@dataclass
class LoraSchema:
    r: int = key("LoRA rank.")
    alpha: int = key("LoRA scaling α.")
    dropout: float = key("LoRA dropout; acts only with train.policy_dropout=true.")
    target_modules: list[str] = key("The adapted projections (attention and MLP).")


@dataclass
class OptimSchema:
    lr: float = key("AdamW learning rate.")
    weight_decay: float = key("AdamW weight decay.")
    batch_size: int = key("Prompts per training step, per process (rank).")


@dataclass
class TrainSchema:
    seed: int = key(
        "Seeds training alone (LoRA init, input order, rollout sampling); default: `seed`."
    )
    share_prefix: bool = key(
        "Run each prompt once per phase and share it across its group (speed)."
    )
    gradient_checkpointing: bool = key(
        "Recompute activations in backward: much less memory for about one more forward."
    )
    policy_dropout: bool = key(
        "LoRA dropout on in the loss's log π_θ pass (plain PEFT training; biases the KL estimate)."
    )
    resume: Any = key(
        "`auto`: continue from <run dir>/checkpoints/last.ckpt if there; null; a .ckpt."
    )
    eval_baseline: bool = key(
        "After training, also evaluate the frozen model and write the frozen-vs-trained summary."
    )
    eval_beam: bool = key("After training, also evaluate the trained adapter with beam search.")
    eval_best_dev: bool = key(
        "After training, also evaluate the dev-best step's adapter (results_best_dev.json)."
    )
    val_size: int = key("Inputs per validation slice (a train and a dev slice).")
    val_at_start: bool = key("Validate once before the first step (step 0 of the curves).")
    val_train_slice: bool = key(
        "Validate on a slice of training inputs too (the train curves); false: the dev slice only."
    )
    checkpoint_every_n_steps: int = key("Write checkpoints/last.ckpt every k steps (for resuming).")
    objective: str = key(
        "`rloo`: RLOO on the bidirectional reward (the paper); `amortised_is`: maximise the "
        "likelihood of Full IS's resampled particles (search.particles, search.potential).",
        choices=OBJECTIVES,
    )
    init_adapter: Any = key(
        "A saved PEFT adapter directory to start training from; null: a fresh LoRA adapter."
    )


@dataclass
class EvalSchema:
    decoding: str = key("Test decoding of mode=eval and after training.", choices=DECODINGS)
    beam_width: int = key("Beam width of eval.decoding=beam.")
    length_penalty: float = key(
        "Beam ranks finished outputs by sum log-prob / length^length_penalty (0: plain sum)."
    )
    num_test_sets: int = key("Test sets drawn from the test pool.")
    test_size: int = key("Examples per test set (capped by the pool).")
    batch_size: int = key("Inputs decoded together.")
    adapter: Any = key(
        "The PEFT adapter that mode=eval, search and export load; null: the frozen base model."
    )
    score_rewards: bool = key("Also score every test output with the frozen reference's rewards.")
    test_set_drawing: str = key(
        "`disjoint`: sets of different seeds share no example; `seed_plus_index`: the drawing "
        "before 2026-11-27.",
        choices=TEST_SET_DRAWINGS,
    )
    sampler_seeds: list[int] = key(
        "mode=search: one draw of a stochastic method per seed, on the same test sets."
    )


@dataclass
class ExportSchema:
    dir: Any = key("Where mode=export writes the merged model folder; null: <run dir>/model.")


@dataclass
class SearchSchema:
    method: str = key("mode=search: Sample-Rerank, Full IS or Full SMC.", choices=SEARCH_METHODS)
    particles: int = key("Particles (samples) per input.")
    potential: Any = key(
        "The expensive potential Φ; null: the paper's pairing (rerank/is: reverse, smc: task).",
        choices=SEARCH_POTENTIALS,
    )
    ess_threshold: float = key("smc resamples when ESS < ess_threshold · particles.")
    temperature: float = key("Proposal temperature (the weights stay exact: p/q).")
    batch_size: int = key("Prompts decoded together, each with `particles` rows.")
    posterior_draws: int = key("Draws for the posterior-weighted metric; 0: skip.")
    greedy_baseline: bool = key(
        "Also decode the same examples greedily: the cost relative to one greedy pass."
    )


@dataclass
class DiagnoseSchema:
    num_inputs: int = key("K dev inputs decoded, greedy plus num_samples constrained samples each.")
    num_labelled: int = key(
        "Labelled rows whose gold output is perturbed field by field (dev rows with gold, else "
        "training rows)."
    )
    num_samples: int = key("M constrained samples per dev input, at rollout.temperature.")
    lambdas: list[float] = key(
        "The reward mixings compared: the argmax of (1-λ)·R_direct/σ_d + λ·R_reverse/σ_r per input."
    )
    batch_size: int = key("Dev inputs decoded together (each with 1 + num_samples rows).")
    min_lift: float = key(
        "A lift of the dev metric by reranking below this is called within noise."
    )
    blind_below: float = key(
        "A field whose pairs the reverse reward prefers gold in fewer than this share of is one "
        "the reward cannot see."
    )


@dataclass
class DataSchema:
    dir: Any = key(
        "The data directory; default $GRAMMARRL_DATA_DIR, else the bundled samples (null)."
    )
    source: str = key("`local` (data.dir) or `hub` (public Hugging Face datasets, needs internet).")
    limit_train: Any = key("Cap on training inputs (CPU-sized runs); null: none.")
    split_seed: int = key("Fixes the train/dev samples, the WoS partition and the few-shot picks.")
    embedder: str = key("Sentence embedder of hint retrieval (the paper: mxbai-embed-large-v1).")


@dataclass
class RewardSchema:
    sigma_direct: Any = key(
        "σ_direct by hand, with sigma_reverse (both or neither); null: calibration file, then "
        "the task's σ table, else calibrate first."
    )
    sigma_reverse: Any = key("σ_reverse by hand, with sigma_direct (both or neither).")
    calibration_file: str = key("The calibrated σ's, keyed by task, model and nN_bB.")
    calibration_seed: int = key(
        "Seeds the samples calibration measures the σ's on (apart from `seed`)."
    )


@dataclass
class TrainerSchema:
    """The `lightning.pytorch.Trainer` arguments conf/trainer/default.yaml sets (built by
    instantiate); a config may add any other argument but those of `TRAINER_SET`."""

    _target_: str = key("The Trainer class, built by hydra.utils.instantiate.")
    accelerator: str = key(
        "`auto` follows `device`; any other value must agree with it.", choices=ACCELERATORS
    )
    devices: Any = key("Processes (ranks); > 1 trains with DDP.")
    strategy: Any = key("Lightning's strategy (`auto`, `ddp`, ...).")
    max_steps: int = key("Training steps.")
    gradient_clip_val: Any = key("Gradient norm clipping; null: none.")
    val_check_interval: Any = key("Validate (greedy, train and dev slices) every k training steps.")
    check_val_every_n_epoch: Any = key("null: validation is scheduled by steps alone.")
    num_sanity_val_steps: int = key("Lightning's sanity validation batches before training.")
    log_every_n_steps: int = key("Log metrics every k steps.")
    enable_model_summary: bool = key("Print Lightning's model summary.")
    use_distributed_sampler: bool = key(
        "false: the step-indexed batch sampler already splits the inputs by rank."
    )


@dataclass
class LoggerSchema:
    name: str = key(
        "Experiment tracking: W&B, or none (metrics.csv is always written).", choices=LOGGERS
    )
    # logger=wandb only
    project: Any = key("logger=wandb: the W&B project.", default=None)
    mode: Any = key(
        "logger=wandb: offline (no account; `wandb sync` later), online or disabled.",
        choices=LOGGER_MODES,
        default=None,
    )
    group: Any = key("logger=wandb: the W&B group; null: one group per sweep.", default=None)
    tags: Any = key(
        "logger=wandb: extra tags (task, model, mode, λ, N, B are added).", default=None
    )


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
# Top-level keys that are not config groups: name -> its type and description.
SCALARS: dict[str, Key] = {
    "mode": Key("What the job does.", MODES, "str"),
    "lambda": Key(
        "Reward mixing: (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse, in [0, 1].", None, "float"
    ),
    "beta": Key("KL coefficient β.", None, "float"),
    "kl_penalty": Key(
        "Where β's term acts: `loss` (the paper's Eq. 8), `reward` (subtracted before RLOO) or "
        "`grammar` (β·(log q_θ − log π_ref) subtracted from the reward).",
        KL_PENALTIES,
        "str",
    ),
    "seed": Key("Seeds the test-set draws, and training unless train.seed is set.", None, "int"),
    "device": Key("`auto` (CUDA if present), `cpu`, `cuda` or `cuda:N`.", None, "str"),
    "skip_completed": Key(
        "Skip a job whose run directory holds its results under the same settings.", None, "bool"
    ),
    "overwrite": Key(
        "Replace outputs a run directory holds from other settings (else refused).", None, "bool"
    ),
    "cache_dir": Key(
        "Model cache, hints and calibration file; default $GRAMMARRL_CACHE_DIR or "
        "~/.cache/grammarrl.",
        None,
        "str",
    ),
    "callbacks": Key(
        "Extra Lightning callbacks by name: `{name: {_target_: module.Class, ...}}`.", None, "dict"
    ),
}


# Arguments of lightning.pytorch.Trainer that GrammarRL sets itself (grammarrl/training/train.py
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
