"""Config composition and validation, run before any model or data is loaded.

Every key must be declared (a top-level scalar or a field of a group's schema in
`grammarrl.config.schema`): an
unknown one, `+key=value` included, is refused with the closest known keys (difflib). Each group
is then merged into its schema (OmegaConf structured configs: a wrong type names its key), and
ranges and contradictions are checked here, with messages that name the key.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grammarrl.config.schema import (
    ACCELERATORS,
    ADAPTER_MODES,
    DECODINGS,
    KL_PENALTIES,
    LOGGER_MODES,
    LOGGERS,
    MODEL_SOURCES,
    MODES,
    MOVED,
    OBJECTIVES,
    SCALARS,
    SCHEMAS,
    SEARCH_METHODS,
    SEARCH_POTENTIALS,
    TEST_SET_DRAWINGS,
    TRAINER_SET,
)
from grammarrl.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


@functools.cache
def trainer_arguments() -> frozenset[str]:
    """The arguments of `lightning.pytorch.Trainer` (its signature) that `trainer.<name>` may
    set: all but those GrammarRL sets itself (`TRAINER_SET`, and `callbacks`, a key of its own)."""
    from lightning.pytorch import Trainer

    return frozenset(inspect.signature(Trainer).parameters) - {*TRAINER_SET, "callbacks"}


def known_keys() -> list[str]:
    """Every key a config may hold: the top-level scalars, `group.field` of each schema and
    `trainer.<argument>` of each Trainer argument a config may set."""
    schema_keys = [f"{group}.{f.name}" for group, schema in SCHEMAS.items() for f in fields(schema)]
    trainer_keys = [f"trainer.{name}" for name in sorted(trainer_arguments())]
    return list(dict.fromkeys([*SCALARS, *schema_keys, *trainer_keys]))


def _similarity(key: str, known: str) -> float:
    """difflib's ratio of two dotted keys, or of their last components if higher."""
    whole = difflib.SequenceMatcher(None, key, known).ratio()
    leaf = difflib.SequenceMatcher(None, key.rsplit(".", 1)[-1], known.rsplit(".", 1)[-1])
    return max(whole, leaf.ratio())


def unknown_key_error(key: str) -> ConfigError:
    """A ConfigError naming an unknown key and the closest known ones (difflib), or where a
    key that moved lives now."""
    if key in MOVED:
        return ConfigError(f"{key}: this key is now {MOVED[key]}")
    group, _, name = key.partition(".")
    if group == "trainer" and name in TRAINER_SET:
        return ConfigError(
            f"{key}: GrammarRL sets this Trainer argument itself; use {TRAINER_SET[name]}"
        )
    scores = {known: _similarity(key, known) for known in known_keys()}
    best = max(scores.values())
    closest = " or ".join([k for k, score in scores.items() if score == best][:3])
    hint = (
        f"did you mean {closest}?"
        if best >= 0.6
        else f"no known key is close, the nearest is {closest}; `--cfg job` prints them all"
    )
    return ConfigError(f"{key}: unknown config key ({hint})")


def check_known_keys(cfg: DictConfig) -> None:
    """Refuse any key that no schema declares, `+key=value` overrides included."""
    for key in cfg:
        if key not in SCALARS and key not in SCHEMAS:
            raise unknown_key_error(str(key))
    for group, schema in SCHEMAS.items():
        names = {f.name for f in fields(schema)}
        for key in cfg[group]:
            if key not in names and (group != "trainer" or key not in trainer_arguments()):
                raise unknown_key_error(f"{group}.{key}")


def _typed(group: str, node: DictConfig) -> DictConfig:
    """Merge a group into its schema: wrong types raise ConfigError. Keys beyond the schema
    (`check_known_keys` allowed them: Trainer arguments) are left to Lightning."""
    names = {f.name for f in fields(SCHEMAS[group])}
    try:
        values = OmegaConf.to_container(node, resolve=True)
        values = {key: value for key, value in values.items() if key in names}
        return OmegaConf.merge(OmegaConf.structured(SCHEMAS[group]), values)
    except OmegaConfBaseException as err:
        key = str(getattr(err, "full_key", None) or getattr(err, "key", None) or "?")
        key = key if key.startswith(f"{group}.") else f"{group}.{key}"
        raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None


def _check(condition: bool, key: str, value: Any, expected: str) -> None:
    if not condition:
        raise ConfigError(f"{key}={value!r} is invalid: expected {expected}")


def resume_setting(value: Any) -> str | Path | None:
    """`train.resume` as `"auto"`, None (start afresh) or the path of an existing checkpoint."""
    if value is None or str(value).lower() in ("null", "none", "false"):
        return None
    if str(value) == "auto":
        return "auto"
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"train.resume={value}: no such checkpoint file "
            "(expected auto, null or the path of a .ckpt file)"
        )
    return path


def device_type(spec: str) -> str:
    """`cpu` or `cuda` for a `device` value (`auto` follows CUDA's availability)."""
    if spec == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if str(spec).startswith("cuda") else "cpu"


def _check_devices(cfg: DictConfig) -> None:
    """`device` is auto, cpu, cuda or cuda:N; `trainer.accelerator` must not contradict it."""
    device = str(cfg.device)
    _check(
        device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit()),
        "device",
        device,
        "auto, cpu, cuda or cuda:N",
    )
    accelerator = str(cfg.trainer.accelerator)
    _check(
        accelerator in ACCELERATORS,
        "trainer.accelerator",
        accelerator,
        f"one of {', '.join(ACCELERATORS)}",
    )
    wanted = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(accelerator)
    if wanted is not None and wanted != device_type(device):
        raise ConfigError(
            f"trainer.accelerator={accelerator} contradicts device={device} (the model is on "
            f"{device_type(device)}): leave trainer.accelerator=auto, which follows device"
        )


def check_keys(cfg: DictConfig) -> None:
    """Every group and scalar present, every key known; else a ConfigError naming the key."""
    for key in (*SCALARS, *SCHEMAS):
        if key not in cfg:
            raise ConfigError(f"missing config key {key!r}")
    check_known_keys(cfg)


def check_values(cfg: DictConfig) -> None:
    """Types, ranges and combinations of the values; a ConfigError naming the first bad key."""
    typed = {group: _typed(group, cfg[group]) for group in SCHEMAS}
    missing = [
        f"{group}.{key}"
        for group, node in typed.items()
        for key in sorted(OmegaConf.missing_keys(node))
    ]
    if missing:
        raise ConfigError(
            f"{missing[0]}: no value (the composed config lacks it; conf/ gives "
            "every key its default)"
        )
    _check_scalars(cfg)
    _check_task_and_model(typed["task"], typed["model"])
    _check_training(cfg, typed)
    _check_evaluation(cfg.mode, typed["eval"], typed["search"])
    _check_diagnose(typed["diagnose"])
    logger = typed["logger"]
    _check(logger.name in LOGGERS, "logger", logger.name, f"one of {', '.join(LOGGERS)}")
    _check(
        logger.name != "wandb" or logger.mode in LOGGER_MODES,
        "logger.mode",
        logger.mode,
        f"one of {', '.join(LOGGER_MODES)}",
    )
    _check_devices(cfg)
    resume_setting(cfg.train.resume)


def _check_scalars(cfg: DictConfig) -> None:
    _check(cfg.mode in MODES, "mode", cfg.mode, f"one of {', '.join(MODES)}")
    lam = cfg["lambda"]
    _check(isinstance(lam, (int, float)) and 0.0 <= lam <= 1.0, "lambda", lam, "a number in [0, 1]")
    _check(isinstance(cfg.beta, (int, float)) and cfg.beta >= 0, "beta", cfg.beta, "a number >= 0")
    _check(cfg.kl_penalty in KL_PENALTIES, "kl_penalty", cfg.kl_penalty, f"one of {KL_PENALTIES}")
    _check(isinstance(cfg.seed, int), "seed", cfg.seed, "an integer")
    _check(isinstance(cfg.train.seed, int), "train.seed", cfg.train.seed, "an integer")
    _check(
        isinstance(cfg.skip_completed, bool), "skip_completed", cfg.skip_completed, "true or false"
    )
    _check(isinstance(cfg.overwrite, bool), "overwrite", cfg.overwrite, "true or false")


def _check_task_and_model(task: Any, model: Any) -> None:
    _check(model.source in MODEL_SOURCES, "model.source", model.source, f"one of {MODEL_SOURCES}")
    for key in ("dev_size", "batch_size", "max_steps", "max_new_tokens"):
        _check(task[key] >= 1, f"task.{key}", task[key], "an integer >= 1")
    _check(
        task.train_size is None or task.train_size >= 1,
        "task.train_size",
        task.train_size,
        "null (every training input) or an integer >= 1",
    )
    _check(task.num_fewshot >= 0, "task.num_fewshot", task.num_fewshot, "an integer >= 0")


def _check_training(cfg: DictConfig, typed: dict[str, Any]) -> None:
    """rollout, optim, trainer callbacks, lora and the reward's σ's."""
    rollout = typed["rollout"]
    _check(rollout.num_samples >= 1, "rollout.num_samples", rollout.num_samples, "N >= 1")
    _check(rollout.beam_width >= 1, "rollout.beam_width", rollout.beam_width, "B >= 1")
    _check(rollout.temperature > 0, "rollout.temperature", rollout.temperature, "a number > 0")
    optim = typed["optim"]
    _check(optim.lr > 0, "optim.lr", optim.lr, "a number > 0")
    _check(optim.batch_size >= 1, "optim.batch_size", optim.batch_size, "an integer >= 1")
    trainer = typed["trainer"]
    _check(trainer.max_steps >= 1, "trainer.max_steps", trainer.max_steps, "an integer >= 1")
    _check_val_interval(trainer.val_check_interval, trainer.check_val_every_n_epoch)
    limit = typed["data"].limit_train
    _check(
        limit is None or (_is_int(limit) and limit >= 1),
        "data.limit_train",
        limit,
        "null (no limit) or an integer >= 1",
    )
    _check(
        isinstance(cfg.callbacks, Mapping),
        "callbacks",
        cfg.callbacks,
        "a mapping {name: {_target_: module.Class, ...}}",
    )
    for name, spec in cfg.callbacks.items():
        _check(
            isinstance(spec, Mapping) and "_target_" in spec,
            f"callbacks.{name}",
            spec,
            "a mapping with _target_ (the callback's class) and its arguments",
        )
    lora = typed["lora"]
    _check(lora.r >= 1, "lora.r", lora.r, "an integer >= 1")
    _check(0.0 <= lora.dropout < 1.0, "lora.dropout", lora.dropout, "a number in [0, 1)")
    train = typed["train"]
    _check(
        train.objective in OBJECTIVES,
        "train.objective",
        train.objective,
        f"one of {', '.join(OBJECTIVES)}",
    )
    if train.init_adapter is not None and cfg.mode == "train":
        _check_init_adapter(Path(str(train.init_adapter)), lora)
    for key in ("sigma_direct", "sigma_reverse"):
        value = cfg.reward[key]
        _check(
            value is None or (isinstance(value, (int, float)) and value > 0),
            f"reward.{key}",
            value,
            "null or a number > 0",
        )
    if (cfg.reward.sigma_direct is None) != (cfg.reward.sigma_reverse is None):
        given = "sigma_direct" if cfg.reward.sigma_direct is not None else "sigma_reverse"
        raise ConfigError(
            f"reward.{given} is set alone: set both σ's by hand, or neither (the calibration "
            "file, the task's table or a calibration then gives both)"
        )


def _check_init_adapter(adapter: Path, lora: Any) -> None:
    """`train.init_adapter`: a saved PEFT adapter of the LoRA shape the config records."""
    import json

    config_file = adapter / "adapter_config.json"
    _check(
        config_file.is_file(),
        "train.init_adapter",
        str(adapter),
        "null or a saved PEFT adapter directory (holding adapter_config.json), e.g. "
        "<train run>/adapter",
    )
    saved = json.loads(config_file.read_text())
    for key, name in (("r", "r"), ("alpha", "lora_alpha")):
        _check(
            saved.get(name) == lora[key],
            f"lora.{key}",
            lora[key],
            f"{saved.get(name)}, the shape of train.init_adapter={adapter} (set lora.{key} to it)",
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_val_interval(interval: Any, every_n_epochs: Any) -> None:
    """`trainer.val_check_interval`: validate every k >= 1 steps (validation is scheduled by
    steps while `trainer.check_val_every_n_epoch` is null), else Lightning's int or fraction."""
    if every_n_epochs is None:
        expected, ok = "an integer >= 1 (validate every k training steps)", _is_int(interval)
    else:
        expected = "an integer >= 1 or a fraction of an epoch in (0, 1]"
        ok = _is_int(interval) or (isinstance(interval, float) and interval <= 1)
    _check(ok and interval > 0, "trainer.val_check_interval", interval, expected)


def _check_evaluation(mode: str, ev: Any, search: Any) -> None:
    """eval (decoding, test sets, the adapter per mode) and search."""
    _check(
        ev.adapter is None or mode in ADAPTER_MODES,
        "eval.adapter",
        ev.adapter,
        f"null with mode={mode} (it is the adapter that mode=eval, search and export load)",
    )
    _check(
        ev.adapter is not None or mode != "export",
        "eval.adapter",
        ev.adapter,
        "the trained adapter to merge and export (mode=export), e.g. <train run>/adapter",
    )
    _check(ev.decoding in DECODINGS, "eval.decoding", ev.decoding, f"one of {DECODINGS}")
    for key in ("beam_width", "num_test_sets", "test_size", "batch_size"):
        _check(ev[key] >= 1, f"eval.{key}", ev[key], "an integer >= 1")
    _check(
        ev.test_set_drawing in TEST_SET_DRAWINGS,
        "eval.test_set_drawing",
        ev.test_set_drawing,
        f"one of {', '.join(TEST_SET_DRAWINGS)}",
    )
    seeds = list(ev.sampler_seeds)
    _check(
        bool(seeds) and all(s >= 0 for s in seeds) and len(set(seeds)) == len(seeds),
        "eval.sampler_seeds",
        seeds,
        "a non-empty list of distinct integers >= 0, e.g. [0, 1, 2]",
    )
    _check(
        search.method in SEARCH_METHODS,
        "search.method",
        search.method,
        f"one of {', '.join(SEARCH_METHODS)}",
    )
    _check(search.particles >= 1, "search.particles", search.particles, "an integer >= 1")
    _check(
        search.potential is None or search.potential in SEARCH_POTENTIALS,
        "search.potential",
        search.potential,
        f"null or one of {', '.join(SEARCH_POTENTIALS)}",
    )
    _check(
        0.0 <= search.ess_threshold <= 1.0,
        "search.ess_threshold",
        search.ess_threshold,
        "a number in [0, 1]",
    )
    _check(search.temperature > 0, "search.temperature", search.temperature, "a number > 0")
    _check(search.batch_size >= 1, "search.batch_size", search.batch_size, "an integer >= 1")
    _check(
        search.posterior_draws >= 0,
        "search.posterior_draws",
        search.posterior_draws,
        "an integer >= 0",
    )


def _check_diagnose(diagnose: Any) -> None:
    """mode=diagnose's sizes, λ's and thresholds."""
    for key in ("num_inputs", "num_labelled", "num_samples", "batch_size"):
        _check(diagnose[key] >= 1, f"diagnose.{key}", diagnose[key], "an integer >= 1")
    lambdas = list(diagnose.lambdas)
    _check(
        bool(lambdas)
        and all(0.0 <= lam <= 1.0 for lam in lambdas)
        and len(set(lambdas)) == len(lambdas),
        "diagnose.lambdas",
        lambdas,
        "a non-empty list of distinct numbers in [0, 1], e.g. [0, 0.25, 0.5, 0.75, 1]",
    )
    _check(diagnose.min_lift >= 0, "diagnose.min_lift", diagnose.min_lift, "a number >= 0")
    _check(
        0.0 <= diagnose.blind_below <= 1.0,
        "diagnose.blind_below",
        diagnose.blind_below,
        "a share in [0, 1]",
    )


def rollout_key(num_samples: int, beam_width: int) -> str:
    """The key of a rollout composition in σ tables: `n3_b3`."""
    return f"n{num_samples}_b{beam_width}"
