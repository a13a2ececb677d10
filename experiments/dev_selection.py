"""Choosing a training run (a setting, a step) on the dev slice only, with how far the dev
inputs leave the choice open.

- `dev_rows` / `dev_interval`: a run's per-example dev record at a validation
  (`validation.jsonl`) and the bootstrap interval of its dev micro-F1 over those inputs;
  `paired_dev_interval`: a run against a reference run (another adapter) on the same dev inputs,
  paired by example id.
- `choose`: the finished run with the best dev metric at its last validation (ties:
  `TrainingRun.selection_key`), never a repetition of a setting with another training seed.
- `dev_selection_table`: one row per run (dev metric at step 0, last and best, its interval,
  dev reward, train KL, empty fields, status), the chosen one shaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.curves import Points, last_mean
from experiments.intervals import counts_of, f1_interval
from experiments.paired import counts_by_set, paired_interval
from experiments.runs import AggregationError, metric_label
from experiments.table_format import Block, Cell, Row, Table
from experiments.training_runs import TrainingRun, by_setting

KL_WINDOW = 20  # train/kl is averaged over this many last logged steps
DEV = "dev"
RULE = (
    "the highest dev {metric} at the last validation among finished runs trained with the test "
    "sets' seed (other training seeds repeat a setting and are not chosen); ties: the higher mean "
    "of the last two validations, then smaller N, then smaller λ. Test numbers are not used."
)


def dev_records(run_path: Path) -> list[dict[str, Any]]:
    """A run's per-example dev records of every validation step, from its `validation.jsonl`;
    [] when it kept none (runs written before 2026-11-27)."""
    path = run_path / "validation.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in rows if r["slice"] == DEV]


def dev_rows(run_path: Path, step: int | None = None) -> list[dict[str, Any]]:
    """A run's per-example dev records at one validation step (default: its last); [] when it
    kept none."""
    dev = dev_records(run_path)
    if not dev:
        return []
    step = max(r["step"] for r in dev) if step is None else step
    return [r for r in dev if r["step"] == step]


def dev_interval(run_path: Path, step: int | None = None) -> tuple[float, float, int] | None:
    """(2.5th, 97.5th percentile, inputs) of the dev micro-F1 at a validation (default: the
    last) over its dev inputs resampled; None without a per-example record or for a metric that
    is not micro-F1."""
    rows = dev_rows(run_path, step)
    counts = counts_of([r["scores"] for r in rows]) if rows else None
    return None if counts is None else (*f1_interval(counts), len(counts))


def paired_dev_interval(
    run_path: Path, reference_path: Path, step: int | None = None, reference_step: int | None = None
) -> tuple[float, float, float, float]:
    """(difference, 2.5th, 97.5th percentile, share of resamples above 0) of dev micro-F1, run −
    reference, over their shared dev inputs drawn with replacement (the same for both); each at
    the given validation step (default: its last). An error when either kept no per-example
    record or they scored different inputs."""
    sides = []
    for path, at in ((run_path, step), (reference_path, reference_step)):
        rows = dev_rows(path, at)
        if not rows:
            raise AggregationError(f"{path}: no per-example dev record (validation.jsonl)")
        sides.append(counts_by_set(rows, key="slice"))
    return paired_interval(*sides)


def choose(runs: Sequence[TrainingRun]) -> TrainingRun | None:
    """The run with the best dev metric at its last validation, among the finished runs (an
    unfinished one has not reached the same step) trained with the study's own seed (other
    training seeds repeat a setting: choosing among them would pick a lucky seed); ties as
    `TrainingRun.selection_key`."""
    candidates = [r for r in runs if r.finished and r.dev(r.metric) and not r.other_seed]
    return max(candidates, key=TrainingRun.selection_key, default=None)


def _interval_cell(interval: tuple[float, float, int] | None) -> Cell:
    if interval is None:
        return Cell(text="no per-example record")
    low, high, size = interval
    return Cell(text=f"[{low:.3f}, {high:.3f}] (n={size})")


def noise_note(runs: Sequence[TrainingRun], chosen: TrainingRun) -> str:
    """Whether the choice stands outside the dev noise: the runner-up's last dev score inside
    the chosen run's interval means the choice could have gone either way."""
    interval = dev_interval(chosen.run.path)
    others = [r for r in runs if r is not chosen and r.finished and r.dev(r.metric)]
    if interval is None or not others:
        return ""
    runner_up = max(others, key=TrainingRun.selection_key)
    value = runner_up.dev(runner_up.metric)[-1][1]
    inside = interval[0] <= value <= interval[1]
    return (
        f" The runner-up ({runner_up.label}, {value:.3f}) is "
        + ("inside" if inside else "outside")
        + f" the chosen run's dev interval [{interval[0]:.3f}, {interval[1]:.3f}]: the choice "
        + ("is within the noise of the dev slice." if inside else "stands outside it.")
    )


def _last(points: Points) -> Cell:
    return Cell(mean=points[-1][1]) if points else Cell()


def _before_training(points: Points) -> Cell:
    """The value logged at step 0 (the validation before the first update), if any."""
    value = dict(points).get(0)
    return Cell(mean=value) if value is not None else Cell()


def _cells(run: TrainingRun) -> list[Cell]:
    """A run's dev metric at step 0, last (with its interval and step) and best, dev reward at
    step 0 and last, train KL at the end, dev empty fields at the end and its status."""
    dev = run.dev(run.metric)
    reward = run.dev("reward")
    kl = last_mean(run.series, "train/kl", KL_WINDOW)
    best = max(dev, key=lambda p: p[1], default=None)
    return [
        _before_training(dev),
        _last(dev),
        _interval_cell(dev_interval(run.run.path)),
        Cell(text=str(dev[-1][0])) if dev else Cell(),
        Cell(text=f"{best[1]:.3f} (step {best[0]})") if best else Cell(),
        _before_training(reward),
        _last(reward),
        Cell(mean=kl) if kl is not None else Cell(),
        _last(run.dev("empty_field_rate")),
        Cell(text=run.status()),
    ]


def dev_selection_table(
    runs: Sequence[TrainingRun], chosen: TrainingRun | None, title: str
) -> Table:
    """One row per training run (`_cells`), the chosen one shaded; `title` opens the caption."""
    metric = metric_label(runs[0].metric) if runs else "metric"
    rows = [
        Row(run.label + (" (chosen)" if run is chosen else ""), _cells(run), shaded=run is chosen)
        for run in by_setting(runs)
    ]
    table = Table(
        "dev_selection",
        f"{title}, choice of the training setting on the dev slice only: dev {metric} of "
        "greedy decoding before training (step 0), at the last validation (with its 95% "
        "bootstrap interval over the dev inputs, where the run kept them) and at its best; dev "
        "reward of the greedy outputs (combined under the run's own λ and σ's) at step 0 and "
        f"last; train KL averaged over the last {KL_WINDOW} logged steps; dev empty-field rate "
        "at the last validation.",
        [
            "run (λ, N)",
            f"dev {metric} @0",
            f"dev {metric} last",
            "95% bootstrap over dev inputs",
            "last val. step",
            f"best dev {metric}",
            "dev reward @0",
            "dev reward last",
            f"train KL (last {KL_WINDOW})",
            "dev empty fields last (%)",
            "status",
        ],
        [Block(rows)],
        best=None,
    )
    table.notes.append(f"Chosen: {RULE.format(metric=metric)} " + _chosen_text(runs, chosen))
    return table


def _chosen_text(runs: Sequence[TrainingRun], chosen: TrainingRun | None) -> str:
    if chosen is None:
        return "No training run has finished yet: none chosen."
    return f"Chosen run: {chosen.label} (run directory {chosen.run.path.name})." + noise_note(
        runs, chosen
    )
