"""Evidence II, the training runs: their logged curves, the choice of a setting on the dev slice
only (`choose`, `dev_selection_table`) and the training-curves figure (`training_curves`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from experiments import analysis, figures
from experiments.intervals import counts_of, f1_interval
from experiments.runs import Evaluation, format_number
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.export import TRAINED_KEYS
from grammarrl.training.callbacks import BEST_DEV_RECORD

if TYPE_CHECKING:
    from experiments.runs import Run

KL_WINDOW = 20  # train/kl is averaged over this many last logged steps
SMOOTH = 10  # moving-average window (logged steps) of the per-step train curves
PAPER_BETA = 0.02  # labels name β (and kl_penalty) only when they differ from the paper's
PENALTY_LABELS = {"reward": " in the reward", "grammar": " in the reward, grammar KL"}
METRIC_LABELS = {"micro_f1": "micro-F1", "bleu": "BLEU", "hierarchical_f1": "hier. F1"}

Points = list[tuple[int, float]]


def curve(series: Mapping[str, Points], key: str) -> Points:
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


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


# --- training runs and the dev-only choice ------------------------------------------------------


@dataclass(frozen=True)
class TrainingRun:
    """One mode=train job: its logged curves and, once finished, its greedy test evaluation
    (results.json), which is reported but never used to choose."""

    run: Run
    series: dict[str, Points]
    greedy: Evaluation | None
    detail: str = ""  # what tells it from a run of the same label in the study (`distinct`)
    best_dev: Evaluation | None = None  # results_best_dev.json (`train.eval_best_dev`)
    best_dev_step: int | None = None  # its step (best_dev.json)

    @property
    def lam(self) -> float:
        return float(self.greedy.lam if self.greedy else self.run.lam)

    @property
    def n(self) -> int:
        return int(self.greedy.num_samples if self.greedy else self.run.get("rollout.num_samples"))

    @property
    def metric(self) -> str:
        return self.greedy.metric if self.greedy else str(self.run.get("task.metric", "micro_f1"))

    @property
    def label(self) -> str:
        """The setting's label, and the training seed when it is not the test sets' seed."""
        seed = f", training seed {self.training_seed}" if self.other_seed else ""
        return self.setting_label + seed

    @property
    def setting_label(self) -> str:
        """λ and N; β and where its KL term enters too when they are not the paper's; what tells
        it from a run of the same label (`detail`)."""
        parts = [f"λ={format_number(self.lam)}", f"N={self.n}"]
        beta, penalty = self.run.get("beta", PAPER_BETA), self.run.get("kl_penalty", "loss")
        if beta != PAPER_BETA or penalty != "loss":
            parts.append(f"β={format_number(beta)}" + PENALTY_LABELS.get(penalty, ""))
        return ", ".join(parts + ([self.detail] if self.detail else []))

    @property
    def training_seed(self) -> int:
        return int(self.run.get("train.seed", self.run.get("seed")))

    @property
    def other_seed(self) -> bool:
        """Trained with another seed than the one that draws the test sets (the study's
        default training seed): a repetition of a setting, not a setting of its own."""
        return self.training_seed != self.run.get("seed")

    def setting(self) -> tuple[tuple[str, object], ...]:
        """What was trained, up to the training seed: task, model and the trained keys."""
        keys = ("task.name", "model.name", *(k for k in TRAINED_KEYS if k != "train.seed"))
        return tuple((key, _trained_value(self.run, key)) for key in keys)

    @property
    def finished(self) -> bool:
        return self.greedy is not None

    def dev(self, name: str) -> Points:
        return curve(self.series, f"val/dev_{name}")

    def status(self) -> str:
        if self.finished:
            return "done"
        return "failed" if self.run.failure else "unfinished"

    def selection_key(self) -> tuple[float, float, int, float]:
        """Dev metric at the last validation, then the mean of the last two validations, then
        smaller N, then smaller λ (rounded, so that float noise breaks no tie)."""
        values = [v for _, v in self.dev(self.metric)]
        last_two = values[-2:]
        return (round(values[-1], 9), round(sum(last_two) / len(last_two), 9), -self.n, -self.lam)


def _trained_value(run: Run, key: str) -> object:
    """A trained key's value; a record from before `kl_penalty` existed trained with `loss`."""
    return run.get(key, "loss" if key == "kl_penalty" else None)


def training_run(run: Run) -> TrainingRun:
    """A training job's curves, its last step's greedy evaluation and, where kept, that of its
    dev-best step."""
    evaluations = {ev.name: ev for ev in run.evaluations()}
    record = run.path / BEST_DEV_RECORD
    step = int(json.loads(record.read_text())["step"]) if record.is_file() else None
    return TrainingRun(
        run,
        analysis.read_metrics(run),
        evaluations.get("results"),
        best_dev=evaluations.get("results_best_dev"),
        best_dev_step=step,
    )


def distinct(runs: Sequence[TrainingRun]) -> list[TrainingRun]:
    """The runs with labels that tell them apart: runs that share a setting label (their
    training seeds aside) are named by the trained keys they differ in (`240 steps`,
    `optim.lr=0.0001`)."""
    settings: dict[str, list[dict[str, object]]] = {}
    for run in runs:
        settings.setdefault(run.setting_label, []).append(dict(run.setting()))

    def detail(run: TrainingRun) -> str:
        same, values = settings[run.setting_label], dict(run.setting())
        keys = [k for k in values if len({repr(other[k]) for other in same}) > 1]
        return ", ".join(_key_text(k, values[k]) for k in keys)

    return [replace(run, detail=detail(run)) for run in runs]


def _key_text(key: str, value: object) -> str:
    return f"{value} steps" if key == "trainer.max_steps" else f"{key}={value}"


def choose(runs: Sequence[TrainingRun]) -> TrainingRun | None:
    """The run with the best dev metric at its last validation, among the finished runs (an
    unfinished one has not reached the same step) trained with the study's own seed (other
    training seeds repeat a setting: choosing among them would pick a lucky seed); ties as
    `TrainingRun.selection_key`."""
    candidates = [r for r in runs if r.finished and r.dev(r.metric) and not r.other_seed]
    return max(candidates, key=TrainingRun.selection_key, default=None)


def dev_interval(run: TrainingRun) -> tuple[float, float, int] | None:
    """(2.5th, 97.5th percentile, inputs) of the dev metric at the run's last validation, over
    its dev inputs resampled (`validation.jsonl`); None for a run that kept no per-example
    record (written before 2026-11-27) or a metric that is not micro-F1."""
    path = run.run.path / "validation.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    dev = [r for r in rows if r["slice"] == "dev"]
    if not dev:
        return None
    last = max(r["step"] for r in dev)
    counts = counts_of([r["scores"] for r in dev if r["step"] == last])
    return None if counts is None else (*f1_interval(counts), len(counts))


def _interval_cell(interval: tuple[float, float, int] | None) -> Cell:
    if interval is None:
        return Cell(text="no per-example record")
    low, high, size = interval
    return Cell(text=f"[{low:.3f}, {high:.3f}] (n={size})")


def _noise_note(runs: Sequence[TrainingRun], chosen: TrainingRun) -> str:
    """Whether the choice stands outside the dev noise: the runner-up's last dev score inside
    the chosen run's interval means the choice could have gone either way."""
    interval = dev_interval(chosen)
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


def dev_selection_table(runs: Sequence[TrainingRun], chosen: TrainingRun | None) -> Table:
    """One row per training run: dev metric at step 0, at the last validation and at its best,
    dev greedy reward at step 0 and last, train KL at the end, dev empty fields at the end."""
    metric = metric_label(runs[0].metric) if runs else "metric"
    rows = []
    for run in sorted(runs, key=lambda r: (r.lam, r.n, r.label)):
        dev = run.dev(run.metric)
        reward, empty = run.dev("reward"), run.dev("empty_field_rate")
        kl = [v for _, v in curve(run.series, "train/kl")][-KL_WINDOW:]
        best = max(dev, key=lambda p: p[1], default=None)
        cells = [
            _before_training(dev),
            _last(dev),
            _interval_cell(dev_interval(run)),
            Cell(text=str(dev[-1][0])) if dev else Cell(),
            Cell(text=f"{best[1]:.3f} (step {best[0]})") if best else Cell(),
            _before_training(reward),
            _last(reward),
            Cell(mean=sum(kl) / len(kl)) if kl else Cell(),
            _last(empty),
            Cell(text=run.status()),
        ]
        is_chosen = run is chosen
        rows.append(Row(run.label + (" (chosen)" if is_chosen else ""), cells, shaded=is_chosen))
    table = Table(
        "dev_selection",
        f"Evidence II, choice of the training setting on the dev slice only: dev {metric} of "
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
    table.notes.append(
        f"Chosen: the highest dev {metric} at the last validation among finished runs trained "
        "with the test sets' seed (other training seeds repeat a setting and are not chosen); "
        "ties: the higher mean of the last two validations, then smaller N, then smaller λ. Test "
        "numbers are not used. "
        + (
            f"Chosen run: {chosen.label} (run directory {chosen.run.path.name})."
            + _noise_note(runs, chosen)
            if chosen
            else "No training run has finished yet: none chosen."
        )
    )
    return table


# --- figure -------------------------------------------------------------------------------------

PANELS = (
    ("train/reward", True),
    ("train/kl", True),
    ("train/validity", True),
    ("train/candidate_tokens", True),  # output length: more entities, longer outputs
    ("val/dev_{metric}", False),
    ("val/dev_empty_field_rate", False),
    ("val/dev_reward", False),
    ("train/log_valid_mass", True),  # Σ_t log π_θ(V_t): mass leaked off the grammar
)


def training_curves(runs: Sequence[TrainingRun], path: Path) -> Path | None:
    """Train reward, KL, validity and output length (moving averages), dev metric, empty
    fields and reward, and the policy's log mass on grammar-allowed tokens, against the
    training step, one line per run; None when nothing was logged."""
    panels = []
    for key, smooth in PANELS:
        key = key.format(metric=runs[0].metric) if runs else key
        lines = {}
        for run in sorted(runs, key=lambda r: (r.lam, r.n, r.label)):
            points = curve(run.series, key)
            lines[run.label] = moving_average(points) if smooth else points
        title = f"{key} (moving avg. {SMOOTH} steps)" if smooth else key
        if key == "val/dev_reward":
            title += " (own λ, σ's)"
        panels.append((title, {label: p for label, p in lines.items() if p}))
    if not any(lines for _, lines in panels):
        return None
    return figures.panel_grid(panels, path)
