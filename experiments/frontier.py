"""Quality against cost, per task, from a comparison's numbers (`compare.comparison`): one
labelled point per system at its forward tokens per output (log axis) and its mean metric,
with the paired 95% bootstrap interval of its difference to the task's reference (the first
`--reference` of that task) drawn around its mean: a bar that does not reach the reference's
line differs from it. Systems whose results record no forward tokens are named under the plot.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from grammarrl.evaluation.plots import save_figure

DODGE = 1.03  # the x factor between systems of the same cost
MARGIN = 3.0  # the x axis reaches this factor beyond the cheapest and the dearest system


@dataclass(frozen=True)
class Point:
    """One system of a frontier plot."""

    label: str
    tokens: float | None  # forward tokens per output; None: not recorded
    mean: float
    interval: tuple[float, float] | None  # the paired interval, around `mean`


def _reference(data: dict[str, Any], task: str) -> dict[str, Any] | None:
    """The task's first reference system."""
    systems = {s["label"]: s for s in data["systems"]}
    return next((systems[r] for r in data["references"] if systems[r]["key"]["task"] == task), None)


def _interval(system: dict[str, Any], reference: str) -> tuple[float, float] | None:
    """The bootstrap interval (examples and draws) of system − reference, shifted by the
    system's mean less the observed difference; None without a bootstrap."""
    found = next((v for v in system["versus"] if v["reference"] == reference), None)
    boot = found and found["bootstrap"]
    if not boot:
        return None
    both = boot["examples_and_draws"]
    shift = system["mean"] - both["observed"]
    return shift + both["low"], shift + both["high"]


def frontier_points(data: dict[str, Any]) -> dict[str, tuple[dict[str, Any] | None, list[Point]]]:
    """Per task: its reference system (None without one) and every system's point."""
    found: dict[str, tuple[dict[str, Any] | None, list[Point]]] = {}
    for system in data["systems"]:
        task = system["key"]["task"]
        reference, points = found.setdefault(task, (_reference(data, task), []))
        cost = system["cost"]
        interval = _interval(system, reference["label"]) if reference is not None else None
        tokens = cost["tokens_per_output"] if cost is not None else None
        points.append(Point(system["label"], tokens, system["mean"], interval))
    return found


def _plot_point(ax: plt.Axes, point: Point, x: float, color: str, reference: bool) -> None:
    """One system: its mean at `x`, its interval as a bar, its label beside it."""
    yerr = None
    if point.interval is not None:
        yerr = [[point.mean - point.interval[0]], [point.interval[1] - point.mean]]
    marker, size = ("*", 9) if reference else ("o", 5)
    ax.errorbar([x], [point.mean], yerr=yerr, fmt=marker, color=color, capsize=3, markersize=size)
    ax.annotate(point.label, (x, point.mean), xytext=(5, 4), textcoords="offset points", fontsize=7)


def _xlabel(points: list[Point]) -> str:
    """The cost axis, and the systems left off it."""
    label = "forward tokens per output (generation + potential, log scale)"
    unknown = [p.label for p in points if not p.tokens]
    if unknown:
        listing = "not plotted (no forward tokens recorded): " + "; ".join(unknown)
        label += "\n" + textwrap.fill(listing, 110)
    return label


def frontier_plot(
    task: str, metric: str, reference: dict[str, Any] | None, points: list[Point], path: Path
) -> Path:
    """One task's frontier (module docstring) as PNG."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    plotted = [p for p in points if p.tokens]
    placed: Counter[float] = Counter()  # systems of one cost (a search's selections) side by side
    for index, point in enumerate(plotted):
        x = point.tokens * DODGE ** placed[point.tokens]
        placed[point.tokens] += 1
        is_reference = reference is not None and point.label == reference["label"]
        _plot_point(ax, point, x, f"C{index % 10}", is_reference)
    if reference is not None:
        ax.axhline(reference["mean"], linestyle=":", color="grey", label=reference["label"])
        ax.legend(fontsize=7, loc="best")
    ax.set_xscale("log")
    if plotted:  # a decade or more, so that the dodge stays small
        costs = [p.tokens for p in plotted]
        ax.set_xlim(min(costs) / MARGIN, max(costs) * DODGE ** max(placed.values()) * MARGIN)
    compared = f"; bars: paired 95% interval vs {reference['label']}" if reference else ""
    ax.set(title=f"{task}: {metric} against cost{compared}", xlabel=_xlabel(points), ylabel=metric)
    ax.title.set_fontsize(9)
    ax.xaxis.label.set_fontsize(8)
    ax.grid(alpha=0.3, which="both")
    return save_figure(fig, path)


def frontier_plots(data: dict[str, Any], out: Path) -> list[Path]:
    """`<out>/frontier_<task>.png` for every task of the comparison."""
    return [
        frontier_plot(task, data["metric"], reference, points, out / f"frontier_{_name(task)}.png")
        for task, (reference, points) in frontier_points(data).items()
    ]


def _name(task: str) -> str:
    """A task name as a file name's part."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", task)
