"""Resume after a real kill: a tiny training run killed with SIGKILL once it has checkpointed,
then restarted with the same command, ends with the same adapter as an uninterrupted run."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
STEPS = 5
TINY_RUN = [
    "model=tiny",
    "task=conll",
    "data.dir=null",
    "logger=none",
    f"trainer.max_steps={STEPS}",
    "optim.batch_size=2",
    "optim.lr=1e-3",
    "task.max_new_tokens=64",
    "task.dev_size=2",
    "reward.sigma_direct=1",
    "reward.sigma_reverse=1",
    "train.checkpoint_every_n_steps=1",
    "trainer.val_check_interval=2",
    "train.val_size=2",
    "eval.num_test_sets=1",
    "eval.test_size=2",
    "data.limit_train=6",  # 3 batches per pass: the run crosses passes
]


def command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "grammarrl.run", *TINY_RUN, f"hydra.run.dir={run_dir}"]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    return e


def run(run_dir: Path, log: Path) -> None:
    with open(log, "w") as handle:
        proc = subprocess.run(
            command(run_dir),
            cwd=ROOT,
            env=env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=False,
        )
    assert proc.returncode == 0, log.read_text()[-3000:]


def checkpoint_step(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
    except (FileNotFoundError, RuntimeError, EOFError):
        return -1


def adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


def test_killed_run_resumes_to_the_same_adapter(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(straight, tmp_path / "straight.log")

    # Start the same run elsewhere and SIGKILL it once a checkpoint after step 2 exists.
    ckpt = killed / "checkpoints" / "last.ckpt"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            command(killed),
            cwd=ROOT,
            env=env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        while proc.poll() is None and checkpoint_step(ckpt) < 2:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
    done = checkpoint_step(ckpt)
    assert 2 <= done < STEPS and not (killed / "adapter").exists()

    (ckpt.parent / ".last.ckpt.cut.tmp").write_bytes(b"half")  # as if the kill cut a write
    run(killed, tmp_path / "resumed.log")  # the same command again
    text = (tmp_path / "resumed.log").read_text()
    assert "Resuming from" in text and f"({done} steps done)" in text
    # Its progress bar counts optimizer steps of the whole run, from where it left off.
    assert re.search(rf"train: +\d+%\|[^|]*\| {done + 1}/{STEPS} \[", text), text[-3000:]

    a, b = adapter(straight), adapter(killed)
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k)  # it did train

    # Rollout samples (sampling stream restored) and per-step metrics are complete and equal.
    samples = [(tmp_path / d / "samples.jsonl").read_text() for d in ("straight", "killed")]
    assert samples[0] == samples[1] and len(samples[0].splitlines()) == STEPS

    def rewards(run_dir: Path) -> dict[int, str]:
        with open(run_dir / "metrics" / "metrics.csv") as handle:
            rows = list(csv.DictReader(handle))
        return {int(r["step"]): r["train/reward"] for r in rows if r.get("train/reward")}

    assert rewards(straight) == rewards(killed) and sorted(rewards(killed)) == list(range(STEPS))
    assert torch.load(ckpt, weights_only=False)["global_step"] == STEPS
    assert (
        json.loads((killed / "results.json").read_text())["scores"]
        == json.loads((straight / "results.json").read_text())["scores"]
    )
    assert not list((killed / "checkpoints").glob(".*.tmp"))
