"""Acceptance: a real 2x2 sweep (λ x rollout beam width) on the tiny model, aggregated into a
table whose four rows carry the numbers of the runs' results.json files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from experiments import aggregate as agg
from experiments.runs import load_sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = ["+experiment=tiny_scale"]  # conf/experiment/tiny_scale.yaml: tiny model, 2 steps


def run_sweep(sweep_dir: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "grammarrl.run",
            "-m",
            *TINY,
            *overrides,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_tiny_2x2_sweep_aggregates_to_four_rows(tmp_path: Path):
    sweep_dir = tmp_path / "sweep"
    proc = run_sweep(sweep_dir, ["lambda=0,1", "rollout.beam_width=1,2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(sweep_dir.glob("*/results.json"))
    assert len(results) == 4, proc.stderr[-3000:]

    agg.aggregate("sweep", [sweep_dir])
    text = (sweep_dir / "aggregate" / "sweep.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| λ=")]
    assert len(rows) == 4, text
    for path in results:
        res = json.loads(path.read_text())
        cfg = res["config"]
        label = f"λ={cfg['lambda']:g} B={cfg['rollout']['beam_width']}"
        row = next(r for r in rows if r.startswith(f"| {label} |"))
        assert f"{res['mean']:.3f} ± {res['std']:.3f}" in row
    evals = load_sweep([sweep_dir]).evaluations()
    assert sorted((ev.lam, ev.beam_width, ev.summary()) for ev in evals) == sorted(
        (r["config"]["lambda"], r["config"]["rollout"]["beam_width"], (r["mean"], r["std"]))
        for r in (json.loads(p.read_text()) for p in results)
    )
