"""Reliability: sweeps that survive failures and skip finished jobs, atomic results and
checkpoints under a full disk, and bad input (each with a clear error or a counted skip).

The exact resume after a real kill is in tests/test_resume.py; validity of constrained outputs in
tests/test_reliability_validity.py. Other bad-input cases are tested where their code lives:
malformed/missing-field rows and unreadable files (test_data.py), bad config values
(test_config.py), missing or mismatched adapters (test_models.py).
"""

from __future__ import annotations

import csv
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grammarrl.module
from grammarrl.data.sources import SAMPLES_DIR
from grammarrl.errors import ConfigError, DataError, GrammarRLError, ModelError
from grammarrl.module import NonFiniteLossError
from grammarrl.results import ResultsWriteError, write_json, write_results
from grammarrl.tasks import load_task
from grammarrl.train import AtomicCheckpointIO, resolve_resume, run_train
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
TINY_TRAIN = [
    "model=tiny", "task=conll", "data.dir=null", "logger=none", "optim.batch_size=2",
    "optim.lr=1e-3", "task.max_new_tokens=64", "task.dev_size=2", "reward.sigma_direct=1",
    "reward.sigma_reverse=1", "trainer.checkpoint_every_n_steps=1",
    "trainer.val_check_interval=100", "trainer.val_size=2", "eval.num_test_sets=1",
    "eval.test_size=2", "data.limit_train=4",
]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRAMMARRL_DATA_DIR"}  # bundled samples
    env["OMP_NUM_THREADS"] = "1"
    return env


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grammarrl.run", *args], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, check=False)


def train_in(work: Path, overrides: list[str]) -> tuple[Path, object]:
    """run_train in a scratch working directory; (run dir, results or the exception raised)."""
    previous = os.getcwd()
    os.chdir(work)
    try:
        try:
            outcome = run_train(compose_config([*TINY_TRAIN, *overrides]))
        except GrammarRLError as err:
            outcome = err
    finally:
        os.chdir(previous)
    runs = sorted((work / "outputs").glob("*/*"), key=lambda p: p.stat().st_mtime)
    return runs[-1], outcome


@pytest.fixture
def copy_samples(tmp_path):
    shutil.copytree(SAMPLES_DIR, tmp_path / "data")
    return tmp_path / "data"


# ----- sweeps ----------------------------------------------------------------------------------
def test_sweep_records_a_failed_job_runs_the_others_and_rerun_skips_completed(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "+experiment=tiny_scale", "lambda=0,1.5", f"hydra.sweep.dir={sweep}"]
    first = cli(*args)
    assert first.returncode != 0  # the sweep reports that a job failed ...
    good = next(p.parent.parent for p in sweep.glob("*/.hydra/overrides.yaml")
                if "lambda=0" in p.read_text().split())
    bad = next(p.parent.parent for p in sweep.glob("*/.hydra/overrides.yaml")
               if "lambda=1.5" in p.read_text().split())
    assert (good / "results.json").is_file(), first.stderr[-3000:]  # ... and the other job ran
    assert not (good / "failed.json").exists()
    failure = json.loads((bad / "failed.json").read_text())
    assert failure["type"] == "ConfigError" and "lambda=1.5" in failure["error"]
    assert not (bad / "results.json").exists()

    timing = (good / "timing.json").read_text()
    assert json.loads(timing)["wall_seconds"] > 0 and not (bad / "timing.json").exists()
    before = (good / "results.json").read_bytes(), (good / "results.json").stat().st_mtime_ns
    second = cli(*args)  # the same sweep again: the completed job is skipped, not re-run
    assert second.returncode != 0
    assert "Skipping this job" in second.stdout + second.stderr
    assert ((good / "results.json").read_bytes(),
            (good / "results.json").stat().st_mtime_ns) == before
    assert (good / "timing.json").read_text() == timing  # a skipped re-run keeps the timing

    from experiments import aggregate as agg

    agg.aggregate("sweep", [sweep])
    listing = (sweep / "aggregate" / "runs.md").read_text()
    assert f"| {bad.name} | **failed**: ConfigError: lambda=1.5 is invalid" in listing
    assert f"| {good.name} | ok |" in listing


def test_failure_record_is_removed_once_the_job_succeeds(tmp_path):
    run = tmp_path / "run"
    args = ["mode=eval", "model=tiny", "task=conll", "logger=none", "task.max_new_tokens=16",
            "eval.num_test_sets=1", "eval.test_size=2", f"hydra.run.dir={run}"]
    failed = cli(*args, f"eval.adapter={tmp_path / 'nowhere'}")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert "no adapter_config.json" in json.loads((run / "failed.json").read_text())["error"]
    ok = cli(*args)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (run / "results.json").is_file() and not (run / "failed.json").exists()


# ----- atomic writes under a full disk ---------------------------------------------------------
class FullDisk:
    """os.fdopen whose handles write a few bytes and then fail with ENOSPC."""

    def __init__(self, real):
        self.real = real

    def __call__(self, fd, *args, **kwargs):
        handle = self.real(fd, *args, **kwargs)
        real_write = handle.write

        def write(data):
            real_write(data[:5])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        handle.write = write
        return handle


def test_disk_full_while_writing_results_keeps_the_previous_results(tmp_path, monkeypatch):
    record = {"task": "conll", "model": "tiny", "decoding": "greedy", "metric": "micro_f1",
              "scores": [0.5], "mean": 0.5, "std": 0.0, "validity": 1.0, "truncated": 0.0,
              "examples_per_second": 1.0, "config": {}}
    path = write_results(tmp_path, record, [{"uid": "a"}])
    before = path.read_text(), (tmp_path / "predictions.jsonl").read_text()
    monkeypatch.setattr(os, "fdopen", FullDisk(os.fdopen))
    with pytest.raises(ResultsWriteError, match=r"No space left on device; the previous "
                                                r"predictions.jsonl is unchanged"):
        write_results(tmp_path, {**record, "mean": 0.9}, [{"uid": "b"}])
    with pytest.raises(ResultsWriteError, match=r"results.json: No space left on device; the "
                                                r"previous results.json is unchanged"):
        write_json(path, {**record, "mean": 0.9})
    monkeypatch.undo()
    assert (path.read_text(), (tmp_path / "predictions.jsonl").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl", "results.json"]


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"global_step": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def full(obj, handle):
        real_save(obj, handle)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(GrammarRLError, match="No space left on device; the previous checkpoint"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["global_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temp file left


# ----- bad input -------------------------------------------------------------------------------
def test_truncated_data_files_are_counted_skips_with_file_and_line(copy_samples, caplog):
    conll = copy_samples / "conll2003" / "test.txt"
    text = conll.read_text()
    conll.write_text(text[: len(text) // 2 + 7])  # cut in the middle of a token line
    wos = copy_samples / "wos" / "wos_labelled.jsonl"
    rows = wos.read_text()
    wos.write_text(rows[:-40])  # the last JSON row cut short
    with caplog.at_level(logging.WARNING):
        task = load_task(compose_config(["task=conll", f"data.dir={copy_samples}"]))
        assert task.splits().skipped["malformed_line"] == 1 and task.splits().test_pool
        wos_task = load_task(compose_config(["task=wos", f"data.dir={copy_samples}"]))
        assert wos_task.splits().skipped == {"malformed_json": 1}
    last = len(rows.splitlines())
    assert f"wos_labelled.jsonl:{last}: row skipped (malformed_json)" in caplog.text
    assert "test.txt:" in caplog.text and "row skipped (malformed_line)" in caplog.text


def test_unknown_config_keys_are_refused_with_their_name(tmp_path):
    typo = cli("lamda=0.3", "model=tiny")  # Hydra: not in the config
    assert typo.returncode != 0 and "Traceback" not in typo.stderr
    assert "Key 'lamda' is not in struct" in typo.stderr
    # Added to a group: the schema refuses it, naming it (exit 2, failure recorded).
    added = cli("+optim.momentum=0.9", "model=tiny", f"hydra.run.dir={tmp_path}")
    assert added.returncode == 2 and "Traceback" not in added.stderr
    assert "optim.momentum: Key 'momentum' not in 'OptimSchema'" in added.stdout + added.stderr
    assert json.loads((tmp_path / "failed.json").read_text())["type"] == "ConfigError"
    with pytest.raises(ConfigError, match=r"^train.resume=/nowhere.ckpt: no such checkpoint"):
        resolve_resume(compose_config(["train.resume=/nowhere.ckpt"]), Path("/tmp"))


def test_empty_test_set_fails_before_training(copy_samples, tmp_path):
    (copy_samples / "conll2003" / "test.txt").write_text("")
    out, err = train_in(tmp_path, [f"data.dir={copy_samples}", "optim.max_steps=1"])
    assert isinstance(err, DataError) and "the test pool is empty" in str(err)
    assert not (out / "checkpoints").exists()  # nothing was trained and lost


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    AtomicCheckpointIO().save_checkpoint({"global_step": 3, "state_dict": {}}, ckpt)
    cfg = compose_config([])  # train.resume=auto
    assert resolve_resume(cfg, tmp_path / "run") == str(ckpt)
    (ckpt.parent / ".last.ckpt.abc.tmp").write_bytes(b"half")  # a write cut by a kill
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"last.ckpt is corrupt or truncated .*delete it"):
        resolve_resume(cfg, tmp_path / "run")
    assert not (ckpt.parent / ".last.ckpt.abc.tmp").exists()
    assert resolve_resume(compose_config(["train.resume=null"]), tmp_path / "run") is None


def test_nan_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    real_loss, calls = grammarrl.module.grammarrl_loss, []

    def loss_nan_at_third_step(*args, **kwargs):
        loss, parts = real_loss(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 3 else loss), parts

    monkeypatch.setattr(grammarrl.module, "grammarrl_loss", loss_nan_at_third_step)
    out, err = train_in(tmp_path, ["optim.max_steps=4"])
    assert isinstance(err, NonFiniteLossError), err
    message = str(err)
    assert "the loss is nan at step 3 (global_step 2)" in message
    assert "no update was applied" in message and "(after 2 steps)" in message
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    assert not (out / "adapter").exists() and not (out / "results.json").exists()

    # A mismatched checkpoint (another base model size) is refused, naming the mismatch.
    monkeypatch.undo()
    _, mismatch = train_in(tmp_path, ["optim.max_steps=4", "model.hidden_size=32",
                                      f"train.resume={out / 'checkpoints' / 'last.ckpt'}"])
    assert isinstance(mismatch, ModelError) and "does not fit this model" in str(mismatch)
    assert "wrong shape" in str(mismatch)


def test_truncated_candidates_are_flagged_not_fatal(tmp_path):
    out, results = train_in(tmp_path, ["optim.max_steps=2", "task.max_new_tokens=2"])
    assert isinstance(results, dict), results
    with open(out / "metrics" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [float(r["train/truncated"]) for r in rows if r.get("train/truncated")] == [1.0, 1.0]
    assert [float(r["train/validity"]) for r in rows if r.get("train/validity")] == [0.0, 0.0]
    greedy = json.loads((out / "results.json").read_text())
    assert greedy["truncated"] == 1.0 and greedy["validity"] == 0.0
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert preds and all(p["truncated"] and not p["valid"] for p in preds)


def test_grammar_rejecting_gold_outputs_is_warned_with_counts(tiny, tmp_path, caplog):
    from grammarrl.evaluate import evaluate

    model, tok = tiny
    cfg = compose_config(["model=tiny", "task=conll", "data.dir=null", "task.max_new_tokens=40",
                          "eval.num_test_sets=1", "eval.test_size=4"])
    task = load_task(cfg)
    empty = '{"person": "", "organization": "", "location": "", "misc": ""}'
    task.grammar = lambda: "start: " + json.dumps(empty)  # admits only the empty output
    with caplog.at_level(logging.WARNING):
        results = evaluate(cfg, model, tok, task, "greedy", tmp_path, progress=False)
    # Every CoNLL gold output names an entity (entityless rows are dropped): all 4 rejected.
    assert "the conll grammar rejects 4 of 4 distinct gold outputs" in caplog.text
    assert (results["gold_rejected"], results["gold_total"]) == (4, 4)
    assert results["validity"] == 1.0


def test_corrupt_adapter_is_a_clear_error(tmp_path, cache_dir):
    from grammarrl.evaluate import run_eval
    from grammarrl.models import add_lora, load_model

    cfg = compose_config(["model=tiny", "mode=eval", "data.dir=null"])
    model, _ = load_model(cfg.model, cache_dir, device="cpu")
    add_lora(model, cfg.lora).save_pretrained(tmp_path / "adapter")
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    cfg = compose_config(["model=tiny", "mode=eval", "data.dir=null", "device=cpu",
                          f"eval.adapter={tmp_path / 'adapter'}"])
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ModelError, match=r"the adapter weights cannot be read"):
            run_eval(cfg)
    finally:
        os.chdir(previous)
