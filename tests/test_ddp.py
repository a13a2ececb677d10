"""Lightning DDP on CPU (gloo, 2 processes) with the `tiny` model, through the CLI: the ranks
split the inputs, average their gradients, log and write once, sample from their own streams,
and resume those streams from a checkpoint."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
DDP = [
    "+experiment=tiny_scale",
    "data.limit_train=null",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.strategy=ddp",
    "train.val_at_start=false",
    "trainer.val_check_interval=100",
    "train.checkpoint_every_n_steps=1",
    "eval.num_test_sets=1",
    "eval.test_size=2",
]


def train(run_dir: Path, probe: Path, steps: int) -> None:
    env = dict(os.environ)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grammarrl.run",
            *DDP,
            f"trainer.max_steps={steps}",
            f"hydra.run.dir={run_dir}",
            "+callbacks.probe._target_=tests.ddp_probe.RankProbe",
            f"+callbacks.probe.out={probe}",
        ],
        cwd=ROOT,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def steps_of(probe: Path) -> dict[int, dict[int, dict]]:
    """step -> rank -> what the probe recorded."""
    found: dict[int, dict[int, dict]] = {}
    for rank in (0, 1):
        for line in (probe / f"rank{rank}.jsonl").read_text().splitlines():
            row = json.loads(line)
            found.setdefault(row["step"], {})[rank] = row
    return found


def adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ddp")
    train(root / "run", root / "probe", steps=4)
    return root / "run", root / "probe"


def test_ranks_split_each_step_and_hold_the_same_adapter(uninterrupted):
    _, probe = uninterrupted
    steps = steps_of(probe)
    assert sorted(steps) == [0, 1, 2, 3] and all(sorted(s) == [0, 1] for s in steps.values())
    trained = []
    for step, ranks in steps.items():
        assert not set(ranks[0]["uids"]) & set(ranks[1]["uids"]), f"step {step}: same input"
        assert ranks[0]["adapter"] == ranks[1]["adapter"], f"step {step}: adapters differ"
        assert ranks[0]["stream"] != ranks[1]["stream"], f"step {step}: one sampling stream"
        trained += ranks[0]["uids"] + ranks[1]["uids"]
    # 16 training inputs, 2 per rank per step: 4 steps are one pass, each input exactly once
    assert len(trained) == len(set(trained)) == 16
    assert len({ranks[0]["adapter"] for ranks in steps.values()}) == 4  # it did train


def test_metrics_and_results_are_written_once(uninterrupted):
    run_dir, _ = uninterrupted
    with open(run_dir / "metrics" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/reward")]
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    assert sorted(p.name for p in run_dir.glob("results*.json")) == ["results.json"]
    assert len((run_dir / "predictions.jsonl").read_text().splitlines()) == 2
    assert not list(run_dir.rglob("*rank*1*.json*"))


def test_resumed_ranks_continue_their_own_streams(uninterrupted, tmp_path):
    run_dir, probe = uninterrupted
    train(tmp_path / "run", tmp_path / "probe", steps=2)
    train(tmp_path / "run", tmp_path / "probe", steps=4)  # continues from last.ckpt at step 2
    resumed, whole = steps_of(tmp_path / "probe"), steps_of(probe)
    for step in (2, 3):
        for rank in (0, 1):
            assert resumed[step][rank]["stream"] == whole[step][rank]["stream"], (step, rank)
            assert resumed[step][rank]["uids"] == whole[step][rank]["uids"]
    final, reference = adapter(tmp_path / "run"), adapter(run_dir)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in final)
