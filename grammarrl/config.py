"""Typed config schemas and validation, run before any model or data is loaded.

Each config group is checked against a dataclass schema (OmegaConf structured configs: a
wrong type names its key), then ranges are checked here with messages that name the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grammarrl.errors import ConfigError

MODES = ("train", "eval", "calibrate", "search", "prepare")
TASKS = ("gloss", "wos", "conll")
MODEL_SOURCES = ("hub", "embedded", "tiny")
DECODINGS = ("greedy", "beam")
SEARCH_METHODS = ("rerank", "is", "smc")
SEARCH_POTENTIALS = ("reverse", "task", "none")


@dataclass
class TaskSchema:
    name: str
    metric: str
    train_size: int
    dev_size: int
    num_fewshot: int
    num_hints: int
    batch_size: int
    max_steps: int
    lr: float
    max_new_tokens: int
    test_fraction: float = 0.5  # share of a single labelled pool (WoS) kept as the test pool
    sigmas: dict[str, dict[str, list[float]]] = field(default_factory=dict)


@dataclass
class ModelSchema:
    name: str
    source: str
    path: Any = None
    dtype: str = "auto"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    init_seed: int = 0


@dataclass
class RolloutSchema:
    num_samples: int = 3
    beam_width: int = 3
    temperature: float = 1.0
    length_penalty: float = 1.0


@dataclass
class LoraSchema:
    r: int = 64
    alpha: int = 128
    dropout: float = 0.05
    target_modules: list[str] = field(default_factory=list)


@dataclass
class OptimSchema:
    lr: float = 7e-7
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 8
    max_steps: int = 1000


@dataclass
class TrainSchema:
    share_prefix: bool = True
    gradient_checkpointing: bool = False
    policy_dropout: bool = False
    resume: Any = "auto"
    eval_baseline: bool = False
    eval_beam: bool = False


@dataclass
class EvalSchema:
    decoding: str = "greedy"
    beam_width: int = 3
    length_penalty: float = 1.0
    num_test_sets: int = 10
    test_size: int = 2000
    batch_size: int = 8
    adapter: Any = None


@dataclass
class SearchSchema:
    method: str = "is"
    particles: int = 10
    potential: Any = None
    ess_threshold: float = 1 / 3
    temperature: float = 1.0
    batch_size: int = 1
    posterior_draws: int = 20
    greedy_baseline: bool = True
    adapter: Any = None


SCHEMAS: dict[str, type] = {
    "task": TaskSchema,
    "model": ModelSchema,
    "rollout": RolloutSchema,
    "lora": LoraSchema,
    "optim": OptimSchema,
    "eval": EvalSchema,
    "train": TrainSchema,
    "search": SearchSchema,
}


def _typed(group: str, node: DictConfig) -> DictConfig:
    """Merge a group into its schema: wrong types or unknown keys raise ConfigError."""
    try:
        values = OmegaConf.to_container(node, resolve=True)
        return OmegaConf.merge(OmegaConf.structured(SCHEMAS[group]), values)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
        raise ConfigError(f"{group}.{key}: {str(err).splitlines()[0]}") from None


def _check(condition: bool, key: str, value: Any, expected: str) -> None:
    if not condition:
        raise ConfigError(f"{key}={value!r} is invalid: expected {expected}")


def validate(cfg: DictConfig) -> None:
    """Check the composed config; raise ConfigError naming the first bad key."""
    for key in ("mode", "lambda", "beta", "seed", *SCHEMAS):
        if key not in cfg:
            raise ConfigError(f"missing config key {key!r}")
    typed = {group: _typed(group, cfg[group]) for group in SCHEMAS}

    _check(cfg.mode in MODES, "mode", cfg.mode, f"one of {', '.join(MODES)}")
    lam = cfg["lambda"]
    _check(isinstance(lam, (int, float)) and 0.0 <= lam <= 1.0, "lambda", lam, "a number in [0, 1]")
    _check(isinstance(cfg.beta, (int, float)) and cfg.beta >= 0, "beta", cfg.beta, "a number >= 0")
    _check(isinstance(cfg.seed, int), "seed", cfg.seed, "an integer")

    task, model = typed["task"], typed["model"]
    _check(task.name in TASKS, "task", task.name, f"one of {', '.join(TASKS)}")
    _check(model.source in MODEL_SOURCES, "model.source", model.source, f"one of {MODEL_SOURCES}")
    for key in ("train_size", "dev_size", "batch_size", "max_steps", "max_new_tokens"):
        _check(task[key] >= 1, f"task.{key}", task[key], "an integer >= 1")
    _check(task.num_fewshot >= 0, "task.num_fewshot", task.num_fewshot, "an integer >= 0")

    rollout = typed["rollout"]
    _check(rollout.num_samples >= 1, "rollout.num_samples", rollout.num_samples, "N >= 1")
    _check(rollout.beam_width >= 1, "rollout.beam_width", rollout.beam_width, "B >= 1")
    _check(rollout.temperature > 0, "rollout.temperature", rollout.temperature, "a number > 0")

    optim = typed["optim"]
    _check(optim.lr > 0, "optim.lr", optim.lr, "a number > 0")
    _check(optim.batch_size >= 1, "optim.batch_size", optim.batch_size, "an integer >= 1")
    _check(optim.max_steps >= 1, "optim.max_steps", optim.max_steps, "an integer >= 1")

    ev = typed["eval"]
    _check(ev.decoding in DECODINGS, "eval.decoding", ev.decoding, f"one of {DECODINGS}")
    _check(ev.beam_width >= 1, "eval.beam_width", ev.beam_width, "an integer >= 1")
    _check(ev.num_test_sets >= 1, "eval.num_test_sets", ev.num_test_sets, "an integer >= 1")
    _check(ev.test_size >= 1, "eval.test_size", ev.test_size, "an integer >= 1")
    _check(ev.batch_size >= 1, "eval.batch_size", ev.batch_size, "an integer >= 1")

    search = typed["search"]
    _check(search.method in SEARCH_METHODS, "search.method", search.method,
           f"one of {', '.join(SEARCH_METHODS)}")
    _check(search.particles >= 1, "search.particles", search.particles, "an integer >= 1")
    _check(search.potential is None or search.potential in SEARCH_POTENTIALS, "search.potential",
           search.potential, f"null or one of {', '.join(SEARCH_POTENTIALS)}")
    _check(0.0 <= search.ess_threshold <= 1.0, "search.ess_threshold", search.ess_threshold,
           "a number in [0, 1]")
    _check(search.temperature > 0, "search.temperature", search.temperature, "a number > 0")
    _check(search.batch_size >= 1, "search.batch_size", search.batch_size, "an integer >= 1")
    _check(search.posterior_draws >= 0, "search.posterior_draws", search.posterior_draws,
           "an integer >= 0")

    lora = typed["lora"]
    _check(lora.r >= 1, "lora.r", lora.r, "an integer >= 1")
    _check(0.0 <= lora.dropout < 1.0, "lora.dropout", lora.dropout, "a number in [0, 1)")

    for key in ("sigma_direct", "sigma_reverse"):
        value = cfg.reward[key]
        _check(value is None or value > 0, f"reward.{key}", value, "null or a number > 0")


def rollout_key(num_samples: int, beam_width: int) -> str:
    """The key of a rollout composition in σ tables: `n3_b3`."""
    return f"n{num_samples}_b{beam_width}"
