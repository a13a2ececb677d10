"""One RLOO step's module on `tiny`: CoNLL, 3 samples and beam 2 per prompt, σ's 0.7 and 0.3."""

from __future__ import annotations

import copy

import torch

from grammarrl.models.loading import add_lora
from grammarrl.tasks import load_task
from grammarrl.training.module import GrammarRLModule
from grammarrl.training.settings import StepSettings
from grammarrl.types import Example
from tests.conftest import compose_config

STEP = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    "task.max_new_tokens=24",
    "rollout.num_samples=3",
    "rollout.beam_width=2",
]


def step_module(tiny, overrides: list[str]) -> tuple[GrammarRLModule, list[Example]]:
    """The module of STEP plus overrides (LoRA initialised with seed 0) and three training
    inputs."""
    cfg = compose_config([*STEP, *overrides])
    torch.manual_seed(0)
    policy = add_lora(copy.deepcopy(tiny[0]), cfg.lora)
    task = load_task(cfg)
    module = GrammarRLModule(policy, tiny[1], task, StepSettings.from_config(cfg, 0.7, 0.3))
    module.setup("fit")
    return module, task.splits().train[:3]
