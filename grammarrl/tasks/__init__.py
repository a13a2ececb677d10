"""Task registry: `load_task(cfg)` builds the task named by `cfg.task.name`; any other name is
a task defined from configuration (`task=custom`, grammarrl/tasks/custom.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from grammarrl.tasks.base import Example, Scores, Splits, Task


def load_task(cfg: DictConfig) -> Task:
    """The task of a composed config (`cfg.task.name`), reading `cfg.data`."""
    from grammarrl.tasks.conll import ConllTask
    from grammarrl.tasks.custom import CustomTask
    from grammarrl.tasks.gloss import GlossTask
    from grammarrl.tasks.wos import WosTask

    registry: dict[str, type[Task]] = {"gloss": GlossTask, "wos": WosTask, "conll": ConllTask}
    return registry.get(cfg.task.name, CustomTask)(cfg)  # CustomTask checks its spec


__all__ = ["Example", "Scores", "Splits", "Task", "load_task"]
