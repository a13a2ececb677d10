"""Figures as PNG (matplotlib, Agg backend): the helpers shared by a training run's own summary
(`grammarrl.evaluation.summary`) and the sweep reports (`experiments.figures`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

LINE_STYLES = ("-", "--", ":", "-.")
"""After matplotlib's ten cycle colours, labels repeat the colours with the next line style."""


def line_style(index: int) -> dict[str, str]:
    """The colour and line style of the `index`-th label: distinct for the first 40 labels."""
    return {"color": f"C{index % 10}", "linestyle": LINE_STYLES[(index // 10) % len(LINE_STYLES)]}


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Write `fig` to `path` (parents created) at 150 dpi and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def panel_grid(
    panels: Sequence[tuple[str, Mapping[str, Sequence[tuple[float, float]]]]],
    path: Path,
    columns: int = 3,
    xlabel: str = "training step",
    ylabels: Sequence[str] | None = None,
) -> Path:
    """Small multiples: one panel per (title, {line label: [(x, y)]}); a label keeps its colour
    in every panel; one legend of every label, in the grid's first unused cell, else in the
    first panel with lines (beyond ten labels, line styles tell apart labels that share a
    colour). `ylabels`: one y-axis label per panel."""
    labels = list(dict.fromkeys(label for _, lines in panels for label in lines))
    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.4 * rows), squeeze=False)
    for index, (ax, (title, lines)) in enumerate(zip(axes.flat, panels)):
        for label, points in lines.items():
            if not points:
                continue
            steps, values = zip(*points)
            ax.plot(
                steps,
                values,
                label=label,
                **line_style(labels.index(label)),
                marker="." if len(points) <= 20 else None,
            )
        ax.set(title=title, xlabel=xlabel)
        if ylabels is not None:
            ax.set_ylabel(ylabels[index])
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    unused = list(axes.flat)[len(panels) :]
    for ax in unused:
        ax.axis("off")
    with_lines = [ax for ax, (_, lines) in zip(axes.flat, panels) if lines]
    if labels and (unused or with_lines):
        handles = [Line2D([], [], label=label, **line_style(i)) for i, label in enumerate(labels)]
        holder = unused[0] if unused else with_lines[0]
        holder.legend(handles=handles, fontsize=7, loc="center" if unused else "best")
    return save_figure(fig, path)
