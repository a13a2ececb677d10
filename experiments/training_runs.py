"""Training runs of a study: one `mode=train` job's logged curves, its greedy test evaluation
(`results.json`) and, where kept, that of its dev-best step; labelled by its setting (λ, N, and β
with where its KL term enters when they are not the paper's), runs of one label told apart by
the trained keys they differ in (`distinct`), and the run whose adapter a search used
(`adapter_owner`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from experiments import analysis
from experiments.curves import Points, curve
from experiments.runs import NO_TEST, Evaluation, format_number
from grammarrl.export import TRAINED_KEYS
from grammarrl.training.callbacks import BEST_DEV_RECORD

if TYPE_CHECKING:
    from experiments.runs import Run

PAPER_BETA = 0.02  # labels name β (and kl_penalty) only when they differ from the paper's
PENALTY_LABELS = {"reward": " in the reward", "grammar": " in the reward, grammar KL"}


@dataclass(frozen=True)
class TrainingRun:
    """One mode=train job: its logged curves and, once finished, its greedy test evaluation
    (results.json), which is reported but never used to choose. A dev-only run
    (`train.eval_test=false`) has none: it is never `finished` here, its status says why."""

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
        if self.run.untested:  # a dev-only run: complete, but no test evaluation to report
            return f"done, {NO_TEST}"
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


def by_setting(runs: Sequence[TrainingRun]) -> list[TrainingRun]:
    """The runs in table order: by λ, then N, then label."""
    return sorted(runs, key=lambda r: (r.lam, r.n, r.label))


def adapter_owner(runs: Sequence[TrainingRun], adapter: str) -> str:
    """The training run whose adapter a search used (λ, N), else the adapter's run directory
    (`<run>/adapter`) or, for an adapter copied elsewhere, its own directory."""
    target = Path(adapter).resolve()
    owner = next((r for r in runs if (r.run.path / "adapter").resolve() == target), None)
    if owner:
        return owner.label
    return target.parent.name if target.name == "adapter" else target.name
