"""Config composition and validation, run before any model or data is loaded.

Every key must be declared (a top-level scalar or a field of a group's schema in
`grammarrl.config.schema`): an unknown one, `+key=value` included, is refused with the closest
known keys (difflib). Each group is then merged into its schema (OmegaConf structured configs: a
wrong type names its key), and every value is checked against what its key declares (its range
or choices: `grammarrl.config.keys`). Written here: only the checks that involve several keys
(or the file system, or the entries of `callbacks`), with messages that name the key.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grammarrl.config.keys import check_value, constrained, is_int, key_of
from grammarrl.config.schema import MOVED, SCALARS, SCHEMAS, TRAINER_SET
from grammarrl.config.schema_evaluation import ADAPTER_MODES
from grammarrl.config.schema_training import LOGGER_MODES
from grammarrl.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def group_options(group: str) -> list[str]:
    """The options of a config group (conf/<group>/*.yaml), empty for a group set in
    config.yaml itself."""
    return sorted(path.stem for path in (Path(CONF_DIR) / group).glob("*.yaml"))


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
    if key in known_keys():
        return _absent_key_error(group, name)
    scores = {known: _similarity(key, known) for known in known_keys()}
    best = max(scores.values())
    closest = " or ".join([k for k, score in scores.items() if score == best][:3])
    hint = (
        f"did you mean {closest}?"
        if best >= 0.6
        else f"no known key is close, the nearest is {closest}; `--cfg job` prints them all"
    )
    return ConfigError(f"{key}: unknown config key ({hint})")


def _absent_key_error(group: str, name: str) -> ConfigError:
    """A known key the composed config lacks: the group options that set it, or how to add it
    (a Trainer argument conf/ leaves out)."""
    setting = [
        f"{group}={option}"
        for option in group_options(group)
        if name in OmegaConf.load(Path(CONF_DIR) / group / f"{option}.yaml")
    ]
    if setting:
        return ConfigError(f"{group}.{name}: applies to {' or '.join(setting)} only")
    return ConfigError(f"{group}.{name}: conf/ does not set it; add it with +{group}.{name}=...")


def missing_option_error(err: MissingConfigException) -> ConfigError:
    """Hydra's missing config group option (`model=13b`) as one line naming the group and its
    options."""
    group, _, option = str(err.missing_cfg_file).rpartition("/")
    options = ", ".join(err.options or [])
    return ConfigError(f"{group}={option} is invalid: expected one of {options}")


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
    """`trainer.accelerator` must not contradict `device`."""
    device, accelerator = str(cfg.device), str(cfg.trainer.accelerator)
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
    """Types, ranges and combinations of the values; a ConfigError naming the first bad key.
    Each key's type and allowed values come from its declaration (`grammarrl.config.keys`);
    the checks written here involve several keys, or the file system."""
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
    for name, declared in SCALARS.items():
        check_value(name, cfg[name], declared, declared.type or "Any")
    for group, schema in SCHEMAS.items():
        for f in fields(schema):
            declared = key_of(f)
            if declared is not None and constrained(declared):
                check_value(f"{group}.{f.name}", typed[group][f.name], declared, str(f.type))
    _check_callbacks(cfg.callbacks)
    _check_combinations(cfg, typed)
    resume_setting(cfg.train.resume)  # the file system: the checkpoint must exist


def _check_callbacks(callbacks: Any) -> None:
    """`callbacks`: a mapping of mappings, each entry named in its error."""
    _check(
        isinstance(callbacks, Mapping),
        "callbacks",
        callbacks,
        "a mapping {name: {_target_: module.Class, ...}}",
    )
    for name, spec in callbacks.items():
        _check(
            isinstance(spec, Mapping) and "_target_" in spec,
            f"callbacks.{name}",
            spec,
            "a mapping with _target_ (the callback's class) and its arguments",
        )


def _check_combinations(cfg: DictConfig, typed: dict[str, Any]) -> None:
    """The checks that involve several keys."""
    trainer, logger = typed["trainer"], typed["logger"]
    # how validation is scheduled: by steps unless trainer.check_val_every_n_epoch is set
    _check_val_interval(trainer.val_check_interval, trainer.check_val_every_n_epoch)
    # W&B needs its mode (logger=none leaves it out)
    _check(
        logger.name != "wandb" or logger.mode is not None,
        "logger.mode",
        logger.mode,
        f"one of {', '.join(LOGGER_MODES)}",
    )
    # a starting adapter of another LoRA shape than lora.r, lora.alpha cannot be trained on
    if typed["train"].init_adapter is not None and cfg.mode == "train":
        _check_init_adapter(Path(str(typed["train"].init_adapter)), typed["lora"])
    # lookup_sigmas uses hand-set σ's only as a pair
    if (cfg.reward.sigma_direct is None) != (cfg.reward.sigma_reverse is None):
        given = "sigma_direct" if cfg.reward.sigma_direct is not None else "sigma_reverse"
        raise ConfigError(
            f"reward.{given} is set alone: set both σ's by hand, or neither (the calibration "
            "file, the task's table or a calibration then gives both)"
        )
    # a dev-only training run draws no test set: no test evaluation of any kind
    if cfg.mode == "train":
        _check_eval_test(typed["train"])
        _check_objective(typed["train"])
    # eval.adapter belongs to the modes that load it
    _check_adapter(cfg.mode, typed["eval"].adapter)
    _check_devices(cfg)  # trainer.accelerator against device


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


TEST_EVALUATIONS = ("eval_beam", "eval_baseline", "eval_best_dev")  # train.*: on the test sets


def _check_eval_test(train: Any) -> None:
    """`train.eval_test=false` (a dev-only run) refuses the other test evaluations after
    training (`TEST_EVALUATIONS`) left on: it draws no test set to evaluate them on."""
    on = [f"train.{name}=true" for name in TEST_EVALUATIONS if train[name]]
    if not train.eval_test and on:
        raise ConfigError(
            f"train.eval_test=false contradicts {', '.join(on)}: a run with "
            "train.eval_test=false draws no test set, and those are test evaluations; set "
            "them to false, or train.eval_test=true"
        )


def _check_objective(train: Any) -> None:
    """Each objective's own keys: `train.proposal` chooses who draws amortised IS's particles
    (RLOO has none to draw); `train.pairwise_weight` acts on RLOO's groups (amortised IS has
    none)."""
    if train.proposal != "policy" and train.objective != "amortised_is":
        raise ConfigError(
            f"train.proposal={train.proposal} applies to train.objective=amortised_is only "
            f"(this run: train.objective={train.objective}, whose rollouts the policy draws)"
        )
    if train.pairwise_weight > 0 and train.objective != "rloo":
        raise ConfigError(
            f"train.pairwise_weight={train.pairwise_weight} applies to train.objective=rloo only "
            f"(this run: train.objective={train.objective}, which draws no RLOO groups)"
        )


def _check_val_interval(interval: Any, every_n_epochs: Any) -> None:
    """`trainer.val_check_interval`: validate every k >= 1 steps (validation is scheduled by
    steps while `trainer.check_val_every_n_epoch` is null), else Lightning's int or fraction."""
    if every_n_epochs is None:
        expected, ok = "an integer >= 1 (validate every k training steps)", is_int(interval)
    else:
        expected = "an integer >= 1 or a fraction of an epoch in (0, 1]"
        ok = is_int(interval) or (isinstance(interval, float) and interval <= 1)
    _check(ok and interval > 0, "trainer.val_check_interval", interval, expected)


def _check_adapter(mode: str, adapter: Any) -> None:
    """`eval.adapter` by mode: the adapter mode=eval, search and export load (export needs one)."""
    _check(
        adapter is None or mode in ADAPTER_MODES,
        "eval.adapter",
        adapter,
        f"null with mode={mode} (it is the adapter that mode=eval, search and export load)",
    )
    _check(
        adapter is not None or mode != "export",
        "eval.adapter",
        adapter,
        "the trained adapter to merge and export (mode=export), e.g. <train run>/adapter",
    )


def rollout_key(num_samples: int, beam_width: int) -> str:
    """The key of a rollout composition in σ tables: `n3_b3`."""
    return f"n{num_samples}_b{beam_width}"
