"""`mode=prepare`: builds the task's artefacts and ends with one JSON summary line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grammarrl.run import dispatch
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"task", "splits", "vocab_size", "gold_accepted", "gold_total", "skipped_rows"}


def last_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["gloss", "wos", "conll"])
def test_prepare_on_the_samples(name, capsys):
    summary = dispatch(compose_config(["mode=prepare", f"task={name}", "data.dir=null"]))
    printed = last_json_line(capsys.readouterr().out)
    assert printed == summary and set(printed) == KEYS
    assert printed["task"] == name
    assert printed["gold_accepted"] == printed["gold_total"] > 0
    assert set(printed["splits"]) == {"train", "dev", "fewshot", "test_pool"}
    assert all(size > 0 for size in printed["splits"].values())
    if name == "conll":
        assert printed["skipped_rows"] == {"no_entity": 6, "unwritable_span": 1}


@pytest.mark.integration
def test_prepare_from_the_command_line(tmp_path):
    env = dict(os.environ)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grammarrl.run",
            "mode=prepare",
            "task=wos",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = last_json_line(result.stdout)
    assert summary["vocab_size"] == 145 and summary["gold_accepted"] == summary["gold_total"] == 30
    assert "samples" in result.stdout


@pytest.mark.integration
def test_prepare_with_a_missing_data_dir_fails_clearly(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grammarrl.run",
            "mode=prepare",
            "task=conll",
            f"data.dir={tmp_path / 'absent'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert "no such directory" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_prepare_on_real_wos(real_data_dir, capsys):
    summary = dispatch(compose_config(["mode=prepare", "task=wos", f"data.dir={real_data_dir}"]))
    assert last_json_line(capsys.readouterr().out) == summary
    assert summary["gold_accepted"] == summary["gold_total"] == 2453
    assert summary["splits"] == {"train": 1176, "dev": 100, "fewshot": 1, "test_pool": 1176}
