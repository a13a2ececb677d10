"""Task registry: `load_task(cfg)` builds the task named by `cfg.task.name`."""

from __future__ import annotations

from omegaconf import DictConfig

from grammarrl.errors import ConfigError
from grammarrl.tasks.base import Example, Scores, Splits, Task


def load_task(cfg: DictConfig) -> Task:
    """The task of a composed config (`cfg.task.name`), reading `cfg.data`."""
    from grammarrl.tasks.conll import ConllTask
    from grammarrl.tasks.gloss import GlossTask
    from grammarrl.tasks.wos import WosTask

    registry: dict[str, type[Task]] = {"gloss": GlossTask, "wos": WosTask, "conll": ConllTask}
    name = cfg.task.name
    if name not in registry:
        raise ConfigError(f"task={name!r} is invalid: expected one of {', '.join(registry)}")
    return registry[name](cfg)


__all__ = ["Example", "Scores", "Splits", "Task", "load_task"]
