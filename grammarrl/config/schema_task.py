"""The schema of the task, model and data groups: what is learned from and by whom
(`grammarrl.config.keys` says what a declaration holds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grammarrl.config.keys import BOOKKEEPING, NOT_DIAGNOSE, ROLLOUTS, key

MODEL_SOURCES = ("hub", "embedded", "tiny")
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")  # model.dtype: torch's names
DATA_SOURCES = ("local", "hub")  # data.source (grammarrl.tasks.common reads it)


@dataclass
class TaskSchema:
    name: str = key("The task's name in results, logs, run directories and calibration keys.")
    metric: str = key(
        "The test metric: fixed per built-in task; for task=custom `auto`, `exact_match`, "
        "`accuracy`, `json_fields_f1` or `bleu` (auto: chosen by the constraint)."
    )
    train_size: int | None = key("Training inputs used; null: every training input.", at_least=1)
    dev_size: int = key("Held-out dev inputs that calibrate the σ's.", at_least=1)
    num_fewshot: int = key("Demonstrations in each prompt.", at_least=0)
    num_hints: int = key(
        "Retrieved hints per prompt (gloss terms, CoNLL spans per type); 0: none.", at_least=0
    )
    batch_size: int = key(
        "The task's prompts per training step (the default of optim.batch_size).", at_least=1
    )
    max_steps: int = key(
        "The task's training steps (the default of trainer.max_steps).",
        at_least=1,
        modes=NOT_DIAGNOSE,
    )
    lr: float = key("The task's learning rate (the default of optim.lr).", modes=NOT_DIAGNOSE)
    max_new_tokens: int = key(
        "Cap on generated tokens per output; longer ones are flagged truncated.", at_least=1
    )
    test_fraction: float | None = key(
        "One labelled pool (WoS, custom without a test file): the share kept as the test pool.",
        above=0,
        below=1,
        default=None,
    )
    _target_: Any = key(
        "The task class; its config file registers the task (grammarrl/tasks/__init__.py).",
        role=BOOKKEEPING,
        default=None,
    )
    sigmas: dict[str, dict[str, list[float]]] = key(
        "The paper's σ table: model -> `nN_bB` -> [σ_direct, σ_reverse]; {}: calibrate.",
        default_factory=dict,
        modes=ROLLOUTS,
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
        "`auto` (bfloat16 on CUDA and CPUs with native bf16, else float32) or a torch dtype name.",
        choices=MODEL_DTYPES,
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
class DataSchema:
    dir: Any = key(
        "The data directory; default $GRAMMARRL_DATA_DIR, else the bundled samples (null)."
    )
    source: str = key(
        "`local` (data.dir) or `hub` (public Hugging Face datasets, needs internet).",
        choices=DATA_SOURCES,
    )
    limit_train: int | None = key(
        "Cap on training inputs (CPU-sized runs); null: none.", at_least=1
    )
    split_seed: int = key("Fixes the train/dev samples, the WoS partition and the few-shot picks.")
    embedder: str = key("Sentence embedder of hint retrieval (the paper: mxbai-embed-large-v1).")
