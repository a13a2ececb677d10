"""A training run's curves: Lightning's CSV metrics read back by step, the facts the summary
states about training (steps, rollout reward and dev metric first and last, groups without
signal), and the figure (`training.png`)."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def read_metrics(run: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Lightning's CSV metrics of a training run directory: column -> [(step, value)], empty
    cells skipped; {} when the run logged nothing. A validation row is placed at the training
    steps done when it ran (its `val/*_trained_steps`; 0 for the one before training)."""
    path = Path(run) / "metrics" / "metrics.csv"
    if not path.is_file():
        return {}
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = next(
                (v for k, v in row.items() if k.endswith("_trained_steps") and v), row.get("step")
            )
            for key, value in row.items():
                if key != "step" and value not in ("", None) and step not in ("", None):
                    series[key].append((int(float(step)), float(value)))
    return dict(series)


def training_facts(
    series: Mapping[str, Sequence[tuple[int, float]]], metric: str
) -> dict[str, Any]:
    """Steps, the rollout reward at the first and last step, the share of rollout groups
    whose candidates were all identical (no signal), and the dev metric's first and last."""

    def ends(key: str) -> list[float] | None:
        points = series.get(key)
        return [points[0][1], points[-1][1]] if points else None

    identical = [v for _, v in series.get("train/identical_groups", [])]
    return {
        "steps": len(series.get("train/reward", [])),
        "rollout_reward": ends("train/reward"),
        "dev_metric": ends(f"val/dev_{metric}"),
        "dev_reward": ends("val/dev_reward"),
        "identical_groups": sum(identical) / len(identical) if identical else None,
        "silent_steps": sum(v >= 1.0 for v in identical),
    }


def training_line(facts: Mapping[str, Any]) -> str:
    """`training_facts` as one sentence of the summary."""
    parts = [f"Training: {facts['steps']} steps"]
    if facts["rollout_reward"]:
        parts.append(
            "rollout reward {:.3f} → {:.3f} (first → last step)".format(*facts["rollout_reward"])
        )
    if facts["dev_metric"]:
        parts.append("dev metric {:.3f} → {:.3f}".format(*facts["dev_metric"]))
    if facts["identical_groups"] is not None:
        parts.append(
            f"{facts['identical_groups']:.0%} of rollout groups had identical "
            f"candidates (no signal); {facts['silent_steps']} steps had no signal at all"
        )
    return "; ".join(parts) + "."


def training_figure(
    series: Mapping[str, Sequence[tuple[int, float]]], metric: str, path: Path
) -> Path | None:
    """reward and dev metric by step (`training.png`); None when nothing was logged."""
    from grammarrl.evaluation.plots import panel_grid

    rewards = {
        "rollouts (train/reward)": series.get("train/reward", []),
        "greedy, dev slice (val/dev_reward)": series.get("val/dev_reward", []),
        "greedy, train slice (val/train_reward)": series.get("val/train_reward", []),
    }
    metrics = {
        f"dev slice (val/dev_{metric})": series.get(f"val/dev_{metric}", []),
        f"train slice (val/train_{metric})": series.get(f"val/train_{metric}", []),
    }
    panels = [
        (title, {k: v for k, v in lines.items() if v})
        for title, lines in (
            ("reward (λ-mixed, σ-scaled)", rewards),
            (f"{metric}, greedy", metrics),
        )
    ]
    if not any(lines for _, lines in panels):
        return None
    return panel_grid(panels, path, columns=2, ylabels=["reward", metric])
