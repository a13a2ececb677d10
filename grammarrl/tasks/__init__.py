"""The task registry.

A built-in task is one module under `grammarrl/tasks/` (reader, hub loader, prompts, grammar,
metric, search potential) plus one `conf/task/<name>.yaml` whose `_target_` names its class,
plus its bundled samples under `grammarrl/data/samples/`. The YAML files are the registry:
nothing else lists the tasks. `conf/task/custom.yaml` is the task defined from configuration
alone (grammarrl/tasks/custom.py), also under other names a spec gives it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from grammarrl.config.checks import CONF_DIR
from grammarrl.errors import ConfigError
from grammarrl.tasks.base import Task
from grammarrl.types import Example, Scores, Splits

TASK_CONF = Path(CONF_DIR) / "task"
CUSTOM = "custom"  # conf/task/custom.yaml: a task defined from configuration


@functools.cache
def task_targets() -> dict[str, str]:
    """Task config name -> its class path, from the `_target_` of every conf/task/*.yaml."""
    targets = {}
    for path in sorted(TASK_CONF.glob("*.yaml")):
        conf = OmegaConf.load(path)
        if conf.get("name") != path.stem or not conf.get("_target_"):
            raise ConfigError(
                f"{path}: a task config needs `name: {path.stem}` and "
                "`_target_: grammarrl.tasks.<module>.<TaskClass>`"
            )
        targets[path.stem] = str(conf["_target_"])
    return targets


def builtin_task_names() -> tuple[str, ...]:
    """The built-in tasks (every task config but `custom`), in name order."""
    return tuple(name for name in task_targets() if name != CUSTOM)


def task_class(task_cfg: Mapping[str, Any]) -> type[Task]:
    """The class of a task config: its `_target_`; configs saved without one (older runs) by
    their name, any name that is no built-in task being a custom task."""
    targets = task_targets()
    target = task_cfg.get("_target_") or targets.get(str(task_cfg.get("name")), targets[CUSTOM])
    try:
        cls = get_class(str(target))
    except (ImportError, ValueError) as err:  # a missing module or name; not a class
        raise ConfigError(f"task._target_={target!r}: cannot import it ({err})") from None
    if not issubclass(cls, Task):
        raise ConfigError(f"task._target_={target!r} is not a grammarrl.tasks.base.Task")
    return cls


def task_label(name: str) -> str:
    """A task's column header in result tables: its class's `table_label`, else its name."""
    target = task_targets().get(name)
    return (task_class({"_target_": target}).table_label or name) if target else name


def load_task(cfg: DictConfig) -> Task:
    """The task of a composed config (`cfg.task`), built from its typed settings (the task's
    `from_config`: `TaskSettings.from_config`, and a custom task's resolved spec)."""
    return task_class(cfg.task).from_config(cfg)


__all__ = [
    "Example",
    "Scores",
    "Splits",
    "Task",
    "builtin_task_names",
    "load_task",
    "task_class",
    "task_label",
]
