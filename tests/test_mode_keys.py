"""Each config key's declared `modes` against what the modes read (issue 55): every recorded mode
runs on `tiny` under `tests.support.config_reads.recording`, and

- a key a mode reads is compared for that mode (else a re-run with another value would reuse
  results the new value would change);
- a key compared for a mode is read by it in one of the runs below, or is listed in
  `NOT_EXERCISED` with the reason the tiny runs cannot reach it (else a re-run with another value
  is refused for nothing: "mode=eval refused because lora.r changed").

The declarations use the mode sets of `grammarrl.config.keys` (TRAINING, ROLLOUTS, ...).
"""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path

import pytest

from grammarrl.config import keys, roles
from grammarrl.job import validate
from grammarrl.run import MODE_HANDLERS, preflight
from grammarrl.runs import rundir
from tests.conftest import compose_config
from tests.support.config_reads import recording

REPO = Path(__file__).resolve().parents[1]
BASE = ["model=tiny", "task=conll", "data.dir=null", "logger=none", "task.dev_size=4"]
SMALL_EVAL = ["eval.test_size=2", "eval.num_test_sets=1", "eval.sampler_seeds=[0]"]
RUNS = {  # each recorded mode, in the configurations whose reads differ
    "eval": [
        SMALL_EVAL,
        [*SMALL_EVAL, "eval.decoding=beam", "eval.score_rewards=true"],
        [*SMALL_EVAL, "task=custom", f"task.spec={REPO}/examples/support_tickets/triage.yaml"],
    ],
    "search": [
        [*SMALL_EVAL, "search.particles=2"],
        [*SMALL_EVAL, "search.particles=2", "search.method=smc", "search.potential=task"],
    ],
    "train": [
        [*SMALL_EVAL, "trainer.max_steps=2", "train.val_size=2", "train.eval_beam=true"],
        [*SMALL_EVAL, "trainer.max_steps=1", "train.val_size=2", "train.objective=amortised_is"],
    ],
    "calibrate": [[]],
    "diagnose": [
        [
            "diagnose.num_inputs=4",
            "diagnose.num_labelled=2",
            "diagnose.num_samples=2",
            "diagnose.bootstrap_draws=10",
        ]
    ],
}
# Keys no run above reaches, with why; they stay compared where declared.
NOT_EXERCISED = {
    "model.path": "read for embedded and hub models, not for tiny",
    "data.limit_train": "read by data.source=hub only",
    "eval.adapter": "null in every run: an adapter needs a trained run first",
    "export.dir": "mode=export, not a recorded mode",
    "callbacks": "empty in every run: Lightning callbacks of one's own",
    "train.init_adapter": "null in every run",
    "trainer.accumulate_grad_batches": "passed to Lightning's Trainer by instantiate",
    "trainer._target_": "passed to Lightning's Trainer by instantiate",
    **{
        f"task.{k}": "a custom task's key: only the eval run uses a custom task"
        for k in (
            "spec",
            "train",
            "dev",
            "test",
            "input_field",
            "output_field",
            "demonstrations",
            "json_schema",
            "regex",
            "lark",
            "choices",
            "instruction",
            "output_format",
            "reverse_instruction",
            "metric",
            "batch_size",
            "lr",
            "max_steps",
        )
    },
}


def _declared_name(key: str, declared: dict) -> str:
    """The declared key a read belongs to (a group's extra key: the group's declared prefix)."""
    while key and key not in declared:
        key = key.rpartition(".")[0]
    return key


@cache
def reads(mode: str, tmp_root: str) -> frozenset[str]:
    """The declared keys `mode` reads over its runs (each in its own working directory)."""
    import os

    declared = roles.declared()
    module_name, func_name = MODE_HANDLERS[mode].split(":")
    handler = getattr(importlib.import_module(module_name), func_name)
    found: set[str] = set()
    for index, overrides in enumerate(RUNS[mode]):
        work = os.path.join(tmp_root, f"{mode}{index}")
        os.makedirs(work, exist_ok=True)
        here = os.getcwd()
        os.chdir(work)
        try:
            cfg = compose_config([*BASE, f"mode={mode}", *overrides])
            validate(cfg)
            extra = preflight(cfg, None, rundir.Plan())
            with recording() as read:
                handler(cfg, **extra)
        finally:
            os.chdir(here)
        found |= {_declared_name(k, declared) for k in read}
    return frozenset(found - {""})


def compared(mode: str) -> set[str]:
    return {
        name
        for name, key in roles.declared().items()
        if mode in key.modes and key.role != keys.BOOKKEEPING
    }


@pytest.mark.parametrize("mode", sorted(RUNS))
def test_a_key_is_compared_for_the_modes_that_read_it_and_no_other(mode, tmp_path_factory):
    read = reads(mode, str(tmp_path_factory.mktemp("modes")))
    declared = roles.declared()
    uncompared = sorted(k for k in read - compared(mode) if declared[k].role != keys.BOOKKEEPING)
    unread = sorted(compared(mode) - read - NOT_EXERCISED.keys())
    assert {"task.name", "model.name"} <= read  # the recording sees the reads
    assert not uncompared, f"mode={mode} reads {uncompared}: add {mode} to their modes"
    assert not unread, f"mode={mode} never reads {unread}: take {mode} out of their modes"
