"""The task registry: conf/task/*.yaml name the task classes; nothing else lists the tasks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grammarrl.data.sources import SAMPLES_DIR
from grammarrl.errors import ConfigError
from grammarrl.job import validate
from grammarrl.tasks import builtin_task_names, task_class, task_label, task_targets
from grammarrl.tasks.base import Task
from grammarrl.tasks.conll import ConllTask
from grammarrl.tasks.custom import CustomTask
from tests.conftest import BUILTIN_TASKS, compose_config


def test_every_task_config_names_its_class():
    assert set(task_targets()) == {*BUILTIN_TASKS, "custom"}
    assert {"gloss", "wos", "conll"} <= set(builtin_task_names())
    for name in BUILTIN_TASKS:
        cls = task_class(compose_config([f"task={name}"]).task)
        assert issubclass(cls, Task) and not issubclass(cls, CustomTask)
        assert cls.name == name and cls.table_label and (SAMPLES_DIR / cls.data_dir).is_dir()
    assert task_class(compose_config(["task=custom"]).task) is CustomTask


def test_configs_saved_without_a_target_resolve_by_name():
    assert task_class({"name": "conll"}) is ConllTask
    assert task_class({"name": "support_tickets"}) is CustomTask  # a renamed custom task


def test_table_labels_come_from_the_task_classes():
    assert task_label("conll") == "CoNLL (F1-micro)" and task_label("gloss") == "Gloss (BLEU)"
    assert task_label("support_tickets") == "support_tickets"


def test_only_tasks_with_a_search_penalty_offer_the_task_potential():
    offered = {name for name in BUILTIN_TASKS if task_class({"name": name}).has_search_penalty()}
    assert {"conll", "gloss"} <= offered and "wos" not in offered


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task._target_=grammarrl.tasks.nope.NopeTask"],
            r"task\._target_='grammarrl\.tasks\.nope",
        ),
        (["task._target_=grammarrl.types.Example"], r"is not a grammarrl\.tasks\.base\.Task"),
        (["task=conll", "task.name=ner"], r"task\.name='ner' is invalid for task=conll"),
    ],
)
def test_bad_task_class_or_name_fails_validation(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_config(overrides))


def test_the_data_layer_does_not_import_the_tasks():
    """grammarrl.data is below grammarrl.tasks: importing every data module loads no task."""
    code = (
        "import sys, pkgutil, importlib, grammarrl.data as d\n"
        "for m in pkgutil.iter_modules(d.__path__): importlib.import_module(f'grammarrl.data.{m.name}')\n"
        "print(sorted(n for n in sys.modules if n.startswith('grammarrl.tasks')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tasks_hold_typed_settings_not_the_config(sample_tasks):
    """Every task is built from `TaskSettings.from_config` (a custom task also from its resolved
    spec) and keeps no part of the config: a changed config after loading moves nothing."""
    from omegaconf import DictConfig

    from grammarrl.tasks import load_task
    from grammarrl.tasks.settings import TaskSettings

    custom = load_task(
        compose_config(["task=custom", "task.spec=examples/support_tickets/triage.yaml"])
    )
    for name, task in {**sample_tasks, "custom": custom}.items():
        held = [k for k, v in vars(task).items() if isinstance(v, DictConfig)]
        assert not held, f"{name} holds config objects: {held}"
        assert isinstance(task.settings, TaskSettings)
    cfg = compose_config(["task=wos", "data.dir=null", "task.dev_size=2", "task.num_hints=2"])
    settings = TaskSettings.from_config(cfg)
    assert (settings.dev_size, settings.num_hints, settings.test_fraction) == (2, 2, 0.5)
    assert settings.data_dir is None and settings.source == "local"
    task = load_task(cfg)
    cfg.task.dev_size = 3
    assert len(task.splits().dev) == 2
    assert custom.settings.dev_size == 16 and custom.settings.num_fewshot == 3
