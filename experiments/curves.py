"""Training curves across runs, from their logged metrics (`metrics/metrics.csv`, read by
`analysis.read_metrics`): one logged metric as (step, value) points, its moving average, and a
grid of panels (train reward, KL, validity, output length, dev metric, empty fields, dev
reward, log mass on grammar-allowed tokens) with one line per run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from experiments import figures

SMOOTH = 10  # moving-average window (logged steps) of the per-step train curves
PANELS = (  # (logged key, smoothed); {metric} is the task's metric
    ("train/reward", True),
    ("train/kl", True),
    ("train/validity", True),
    ("train/candidate_tokens", True),  # output length: more entities, longer outputs
    ("val/dev_{metric}", False),
    ("val/dev_empty_field_rate", False),
    ("val/dev_reward", False),
    ("train/log_valid_mass", True),  # Σ_t log π_θ(V_t): mass leaked off the grammar
)

Points = list[tuple[int, float]]
Series = Mapping[str, Points]  # logged key -> points


def curve(series: Series, key: str) -> Points:
    """A logged metric as (step, value) sorted by step; a step logged twice (a resumed run
    re-ran it) keeps its last value."""
    return sorted(dict(series.get(key, [])).items())


def moving_average(points: Points, window: int = SMOOTH) -> Points:
    """Trailing moving average over the last `window` logged points."""
    values = [v for _, v in points]
    return [
        (step, sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)))
        for i, (step, _) in enumerate(points)
    ]


def last_mean(series: Series, key: str, window: int) -> float | None:
    """The mean of a logged metric over its last `window` logged steps; None when not logged."""
    values = [v for _, v in curve(series, key)][-window:]
    return sum(values) / len(values) if values else None


def training_curves(
    runs: Mapping[str, Series], metric: str, path: Path, panels=PANELS
) -> Path | None:
    """One panel per logged key of `panels` against the training step, one line per run (its
    label → its logged series, in the order given); smoothed keys as moving averages of
    `SMOOTH` steps. None when nothing was logged."""
    grid = []
    for key, smooth in panels:
        key = key.format(metric=metric)
        lines = {}
        for label, series in runs.items():
            points = curve(series, key)
            lines[label] = moving_average(points) if smooth else points
        title = f"{key} (moving avg. {SMOOTH} steps)" if smooth else key
        if key == "val/dev_reward":
            title += " (own λ, σ's)"
        grid.append((title, {label: p for label, p in lines.items() if p}))
    if not any(lines for _, lines in grid):
        return None
    return figures.panel_grid(grid, path)
