"""W&B logging read back from the files W&B writes offline: a train and an eval job, each in its
own run, with its config, tags, per-step metrics, test results and predictions table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def run_job(run_dir: Path, *overrides: str) -> Path:
    """Run one tiny job with W&B offline into `run_dir`; returns its offline W&B run folder."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grammarrl.run",
            "+experiment=tiny_scale",
            "logger=wandb",
            "trainer.max_steps=2",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    return wandb_run


@pytest.fixture(scope="module")
def train_and_eval(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """mode -> (run dir, offline W&B run folder) for one train and one eval job."""
    root = tmp_path_factory.mktemp("wandb")
    return {mode: (root / mode, run_job(root / mode, f"mode={mode}")) for mode in ("train", "eval")}


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_job_logs_its_config_tags_results_and_predictions(train_and_eval, read_wandb_offline, mode):
    run_dir, wandb_run = train_and_eval[mode]
    logged = read_wandb_offline(wandb_run)
    results = json.loads((run_dir / "results.json").read_text())

    assert logged["run"].job_type == mode
    assert {"task=conll", "model=tiny", f"mode={mode}"} <= set(logged["run"].tags)
    assert logged["config"]["mode"] == mode
    summary = logged["summary"]
    assert summary["results/mean"] == pytest.approx(results["mean"])
    assert summary["results/std"] == pytest.approx(results["std"])
    assert summary["results/scores"] == pytest.approx(results["scores"])  # one per test set
    assert summary["results/validity"] == pytest.approx(results["validity"])

    table = logged["tables"]["predictions"]
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(table["data"]) == len(rows) == 2 * 4  # 2 test sets of 4
    column = table["columns"].index("prediction")
    assert [row[column] for row in table["data"]] == [row["prediction"] for row in rows]


def test_train_job_logs_every_step_and_validation(train_and_eval, read_wandb_offline):
    logged = read_wandb_offline(train_and_eval["train"][1])
    steps = [row for row in logged["history"] if "train/reward" in row]
    assert [row["trainer/global_step"] for row in steps] == [0, 1]  # max_steps=2
    assert {"lambda=0.5", "N=2", "B=3"} <= set(logged["run"].tags)
    validations = [row for row in logged["history"] if "val/dev_micro_f1" in row]
    assert len(validations) == 3  # step 0 (before training), then after each of the 2 steps
    assert "rollout_samples" in logged["tables"]


def test_eval_job_logs_no_training(train_and_eval, read_wandb_offline):
    logged = read_wandb_offline(train_and_eval["eval"][1])
    assert not [row for row in logged["history"] if "train/reward" in row]
    assert "decoding=greedy" in logged["run"].tags and "adapter=no" in logged["run"].tags
