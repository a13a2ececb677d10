"""The prepared GPU check (`python -m benchmarks.device`) at tiny shapes on CPU, through the same
code, and the set-up it carries to a machine without network (`benchmarks.device_setup`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from benchmarks import device_setup
from benchmarks.rl_step import PHASES
from tests.conftest import REPO

REPORT_KEYS = {"mode", "machine", "settings", "setup", "tests", "rl_step", "eval", "total_s"}


@pytest.mark.integration
def test_tiny_device_check_writes_its_report_and_table(tmp_path):
    out = tmp_path / "device.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.device", "--tiny", "--out", str(out)]
        + ["--assets", str(tmp_path / "no-assets")],  # as in CI: nothing carried
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert REPORT_KEYS <= report.keys() and report["mode"] == "tiny"
    step = report["rl_step"]
    assert len(step["steps_s"]) == 3
    for phases in step["steps_s"]:
        assert set(phases) == set(PHASES) and all(phases[p] > 0 for p in PHASES)
    assert (
        step["steps_s"][0]["step"] >= step["steps_s"][0]["rollout"] + step["steps_s"][0]["policy"]
    )
    assert step["prompt_tokens"]["count"] == 3 * report["settings"]["batch_size"]
    assert step["memory"]["peak_bytes"] > 0 and step["plan_gb"] > 0
    for batch in ("batch_1", "batch_32"):
        assert report["eval"][batch]["examples_per_s"] > 0
    assert report["eval"]["batch_32"]["examples"] == 32
    tests = report["tests"]  # the cuda tests ran in their subprocess and skipped without CUDA
    assert tests["returncode"] == 0 and not tests["failed"] and tests["skipped"] >= 4
    assert report["settings"]["prompts"] == "bundled samples"
    table = done.stdout
    assert "device check (tiny)" in table and f"wrote {out}" in table
    for phase in PHASES:
        assert f"  {phase} " in table
    assert "greedy eval: batch 1" in table and "peak memory" in table


def test_carried_tokenizer_hints_and_data_are_used_there(tmp_path, monkeypatch):
    """What `prepare` saves is what the device side reads: the tokenizer, the hint table
    unpacked under the task's key for its own data folder, the data unpacked."""
    assets = tmp_path / "assets"
    device_setup.save_tokenizer(assets / "tokenizer")
    carried = device_setup.load_carried_tokenizer(assets)
    assert carried.get_vocab() == device_setup.load_carried_tokenizer(tmp_path).get_vocab()

    samples = REPO / "grammarrl" / "data" / "samples"
    device_setup.save_hints(assets / "hints", None)
    assert device_setup.save_data(assets / "data", str(samples))
    assert not list((assets / "data" / "conll2003").glob("*.txt"))  # only packed
    data = device_setup.real_data(assets)
    for name in ("train.txt", "valid.txt", "test.txt"):
        unpacked = data / "conll2003" / name
        assert unpacked.read_bytes() == (samples / "conll2003" / name).read_bytes()

    # The device's own cache is empty and its samples lie elsewhere: another key, same table.
    there = tmp_path / "elsewhere"
    shutil.copytree(samples, there / "samples")
    task = device_setup.conll_task(there / "samples", cache_dir=tmp_path / "cache")
    assert not task.hint_index.path.exists()
    assert device_setup.place_hints(task, assets)
    here = device_setup.conll_task(None)
    assert json.loads(task.hint_index.path.read_text()) == json.loads(
        here.hint_index.path.read_text()
    )
    monkeypatch.setattr("grammarrl.data.hints.sentence_encoder", lambda *a: pytest.fail("embedder"))
    task.prepare_hints()  # every input's hints are in the placed table: no embedder needed


def test_install_without_wheels_says_how_to_make_them(tmp_path, monkeypatch):
    monkeypatch.setattr(device_setup, "missing_modules", lambda: ["llguidance"])
    with pytest.raises(SystemExit, match="python -m benchmarks.device_setup"):
        device_setup.install(tmp_path)
