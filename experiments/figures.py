"""The paper's figures as PNG (matplotlib, Agg backend), from logged metrics and predictions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from experiments.runs import format_number
from grammarrl.evaluation.plots import panel_grid, save_figure

__all__ = ["Curve", "LambdaPoint", "against_lambda", "panel_grid", "training_curves"]

RUN_MARKERS = (".", "x", "^", "s")  # dev and train already take the line styles


@dataclass(frozen=True)
class Curve:
    """One training run's logged metric on the train slice and on the held-out dev slice."""

    task: str
    label: str
    train: list[tuple[int, float]]
    dev: list[tuple[int, float]]


def training_curves(curves: Sequence[Curve], path: Path, metric_names: Mapping[str, str]) -> Path:
    """One panel per task; per run, the dev metric (solid) and the train metric (dashed), in
    one of the ten cycle colours, with another marker for each further ten runs."""
    tasks = list(dict.fromkeys(c.task for c in curves))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for index, curve in enumerate(c for c in curves if c.task == task):
            color, marker = f"C{index % 10}", RUN_MARKERS[(index // 10) % len(RUN_MARKERS)]
            for points, style, split in ((curve.dev, "-", "dev"), (curve.train, "--", "train")):
                if points:
                    steps, values = zip(*points)
                    ax.plot(
                        steps,
                        values,
                        style,
                        color=color,
                        marker=marker,
                        label=f"{curve.label} ({split})",
                    )
        ax.set(title=task, xlabel="training step", ylabel=metric_names.get(task, "metric"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


@dataclass(frozen=True)
class LambdaPoint:
    """Statistics of one λ: (mean, std) over test sets."""

    lam: float
    values: Mapping[str, tuple[float, float]]


def against_lambda(
    points: Sequence[LambdaPoint],
    panels: Sequence[tuple[str, str]],
    path: Path,
    baselines: Mapping[str, Mapping[str, float]] | None = None,
    title: str = "",
) -> Path:
    """One panel per statistic (key, y label): mean ± std against λ; optional horizontal lines
    (baselines[key][name] = value) for the frozen model's greedy and beam decoding."""
    points = sorted(points, key=lambda p: p.lam)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4), squeeze=False)
    lams = [p.lam for p in points]
    for ax, (key, ylabel) in zip(axes[0], panels):
        means = [p.values[key][0] for p in points]
        stds = [p.values[key][1] for p in points]
        ax.errorbar(lams, means, yerr=stds, marker="o", capsize=3, label="GrammarRL")
        for index, (name, value) in enumerate((baselines or {}).get(key, {}).items()):
            ax.axhline(value, linestyle=":", color=f"C{index + 1}", label=f"frozen ({name})")
        ax.set(
            xlabel="λ", ylabel=ylabel, xticks=lams, xticklabels=[format_number(lam) for lam in lams]
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
