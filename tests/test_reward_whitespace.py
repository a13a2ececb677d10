"""Outputs that start with whitespace merge with the reverse prompt's template tokens: the cached
static prefix (tokenized from stand-in outputs) is not a prefix of their reverse prompts, and
reward scoring must still work (rows that do not start with it are scored without it)."""

from __future__ import annotations

import json
import math

from grammarrl.job import validate
from grammarrl.training.train import run_train
from tests.test_custom_task import config, spec_file, write_jsonl

LEADING_SPACES = "  [a-z]{1,4}"


def test_a_task_whose_outputs_start_with_spaces_calibrates_and_trains(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "train.jsonl", [{"text": f"note {i} on item {i}"} for i in range(40)])
    spec = spec_file(
        tmp_path,
        json_schema=None,
        regex=LEADING_SPACES,
        output_field=None,
        num_fewshot=0,
        name="spaced",
    )
    cfg = config(
        spec,
        "logger=none",
        "trainer.max_steps=1",
        "optim.batch_size=2",
        "task.max_new_tokens=8",
        "task.dev_size=2",
        "train.val_size=2",
        "eval.num_test_sets=1",
        "eval.test_size=2",
        f"reward.calibration_file={tmp_path}/calibration.json",
    )
    validate(cfg)
    monkeypatch.chdir(tmp_path)
    results = run_train(cfg)  # raised "every sequence must start with the given prefix"
    (entry,) = json.loads((tmp_path / "calibration.json").read_text())["spaced/tiny/n3_b3"]
    assert math.isfinite(entry["sigma_direct"]) and entry["sigma_direct"] > 0
    assert math.isfinite(entry["sigma_reverse"]) and entry["sigma_reverse"] > 0
    assert results["greedy"]["num_examples"] == 2
