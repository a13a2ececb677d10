"""The job's config: composed from conf/ as `python -m grammarrl.run` composes it, with a custom
task's spec file merged in, and validated before any model is loaded. Above both the config
checks and the tasks (a custom task's keys are checked by the task's own code)."""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from grammarrl.config.checks import CONF_DIR, check_keys, check_values, unknown_key_error
from grammarrl.tasks.custom import check_task_keys
from grammarrl.tasks.custom_spec import merge_spec_file


def compose_job_config(overrides: list[str]) -> DictConfig:
    """The config one job would get from `python -m grammarrl.run <overrides>`, resolved (Hydra's
    own section is used for `${hydra:...}` interpolations, then dropped). An override of a key
    the config lacks is a ConfigError naming it; other composition errors are Hydra's."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except ConfigCompositionException as err:
        key = getattr(err.__cause__, "full_key", None)
        if key:
            raise unknown_key_error(str(key)) from None
        raise
    previous = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        with open_dict(cfg):
            cfg.pop("hydra")
        if cfg.task.get("spec") is not None:
            # before resolving: optim.batch_size, optim.lr and trainer.max_steps interpolate
            # the spec's task.batch_size, task.lr and task.max_steps
            merge_spec_file(cfg.task)
        OmegaConf.resolve(cfg)  # `${hydra:...}` reads the section just set aside
    finally:
        HydraConfig.instance().cfg = previous
    return cfg


def validate(cfg: DictConfig) -> None:
    """Check the composed config; raise ConfigError naming the first bad key."""
    check_keys(cfg)
    check_task_keys(cfg)  # a custom task: its spec file merged into cfg.task, then checked
    check_values(cfg)
