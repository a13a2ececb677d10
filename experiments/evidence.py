"""Evidence II: does GrammarRL's greedy output beat the frozen model's on SmolLM2 / CoNLL, and
when it does not, is it because training did not raise the reward of greedy's outputs or because
a higher reward does not mean a higher F1?

Three sweeps (`conf/experiment/evidence2_*_cpu.yaml`), aggregated by role:

- TRAIN (`mode=train`, λ x N): the setting is chosen on the dev curves only (`dev_selection`);
  test numbers never enter the choice.
- BASELINES: frozen greedy, frozen beam, Sample-Rerank (whose results also hold the paired Full
  IS selection on the very same particles, `selections.is`).
- PROPOSAL (optional): IS with a trained adapter as the proposal, one job per particle count.

`comparison` sets every system side by side on the same seeded test sets, with paired per-set
differences against frozen greedy and Sample-Rerank; `mechanism` gives the frozen reference's
rewards of what each system emits (`eval.score_rewards`) and the combined training reward they
make under the chosen run's σ's. A partial study aggregates: what is missing shows as missing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments import analysis, figures, paper_tables
from experiments.runs import BASELINE, GRAMMARRL, AggregationError, Evaluation, format_number
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.calibration import calibration_conditions, calibration_key, differences, entries
from grammarrl.errors import GrammarRLError
from grammarrl.results import mean_std
from grammarrl.rloo import combine_rewards

if TYPE_CHECKING:
    from experiments.runs import Run, Sweep

KL_WINDOW = 20  # train/kl is averaged over this many last logged steps
SMOOTH = 10  # moving-average window (logged steps) of the per-step train curves
REFERENCE_LAMBDA = 0.5  # the paper's default λ: a fixed GrammarRL row and a combined-reward column
REFERENCE_N = 3  # ... and its N
PAPER_BETA = 0.02  # labels name β (and kl_penalty) only when they differ from the paper's
# What fixes the seeded test sets: rows that differ in any of these were scored on other sets.
TEST_SET_KEYS = ("task.name", "data.split_seed", "eval.num_test_sets", "eval.test_size", "seed")
MISSING = "missing"
METRIC_LABELS = {"micro_f1": "micro-F1", "bleu": "BLEU", "hier_f1": "hier. F1"}
SEARCH_LABELS = {"rerank": "Sample-Rerank", "is": "Full IS", "smc": "Full SMC"}
USAGE = "evidence2 takes TRAIN_SWEEP BASELINES_SWEEP [PROPOSAL_SWEEP]"

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
        """λ and N; β and where its KL term enters too when they are not the paper's."""
        parts = [f"λ={format_number(self.lam)}", f"N={self.n}"]
        beta, penalty = self.run.get("beta", PAPER_BETA), self.run.get("kl_penalty", "loss")
        if beta != PAPER_BETA or penalty != "loss":
            parts.append(
                f"β={format_number(beta)}" + (" in the reward" if penalty == "reward" else "")
            )
        return ", ".join(parts)

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


def training_run(run: Run) -> TrainingRun:
    greedy = next((ev for ev in run.evaluations() if ev.name == "results"), None)
    return TrainingRun(run, analysis.read_metrics(run), greedy)


def choose(runs: Sequence[TrainingRun]) -> TrainingRun | None:
    """The run with the best dev metric at its last validation, among the finished runs (an
    unfinished one has not reached the same step); ties as `TrainingRun.selection_key`."""
    candidates = [r for r in runs if r.finished and r.dev(r.metric)]
    return max(candidates, key=TrainingRun.selection_key, default=None)


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
    for run in sorted(runs, key=lambda r: (r.lam, r.n)):
        dev = run.dev(run.metric)
        reward, empty = run.dev("reward"), run.dev("empty_field_rate")
        kl = [v for _, v in curve(run.series, "train/kl")][-KL_WINDOW:]
        best = max(dev, key=lambda p: p[1], default=None)
        cells = [
            _before_training(dev),
            _last(dev),
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
        "greedy decoding before training (step 0), at the last validation and at its best; dev "
        "reward of the greedy outputs (combined under the run's own λ and σ's) at step 0 and "
        f"last; train KL averaged over the last {KL_WINDOW} logged steps; dev empty-field rate "
        "at the last validation.",
        [
            "run (λ, N)",
            f"dev {metric} @0",
            f"dev {metric} last",
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
        f"Chosen: the highest dev {metric} at the last validation among finished runs; ties: the "
        "higher mean of the last two validations, then smaller N, then smaller λ. Test numbers "
        "are not used. "
        + (
            f"Chosen run: {chosen.label} ({chosen.run.path})."
            if chosen
            else "No training run has finished yet: none chosen."
        )
    )
    return table


# --- the systems compared on the test sets ------------------------------------------------------


@dataclass(frozen=True)
class System:
    """One row of the comparison: the evaluation behind it (the Sample-Rerank run's, for the
    paired IS selection read from it) and its per-set scores; None when missing."""

    label: str
    evaluation: Evaluation | None
    scores: tuple[float, ...] | None = None
    role: str = ""  # greedy, rerank, is (paired selection), chosen: the rows others refer to

    @property
    def present(self) -> bool:
        return self.scores is not None

    @property
    def paired_selection(self) -> bool:
        """A selection on another method's particles (Full IS on the rerank particles): its
        outputs were not scored."""
        return self.role == "is"

    def rewards(self) -> list[tuple[float, float]] | None:
        """Per test set (mean R_direct, mean R_reverse) of its outputs; None when not scored."""
        if self.evaluation is None or self.paired_selection:
            return None
        values = [
            (s.get("reward_direct"), s.get("reward_reverse"))
            for s in self.evaluation.results.get("per_set") or []
        ]
        if not values or not all(_finite(d) and _finite(r) for d, r in values):
            return None
        return [(float(d), float(r)) for d, r in values]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def system(label: str, ev: Evaluation | None, role: str = "") -> System:
    return System(label, ev, tuple(ev.scores) if ev else None, role)


def by_role(systems: Sequence[System], role: str) -> System:
    return next(row for row in systems if row.role == role)


@dataclass(frozen=True)
class Study:
    train: list[TrainingRun]
    baselines: list[Evaluation]
    proposal: list[Evaluation]


def load_study(sweep: Sweep) -> Study:
    """The sweeps by role, in the order given: TRAIN, BASELINES, [PROPOSAL]."""
    if not 2 <= len(sweep.roots) <= 3:
        raise AggregationError(f"{USAGE}; got {len(sweep.roots)} directories")
    groups = [[run for run in sweep.runs if run.path.is_relative_to(root)] for root in sweep.roots]
    for root, runs, modes in zip(
        sweep.roots, groups, (("train",), ("eval", "search"), ("search",))
    ):
        if not any(run.mode in modes for run in runs):
            raise AggregationError(f"{root}: no mode={'/'.join(modes)} runs ({USAGE})")
    train = [training_run(run) for run in groups[0] if run.mode == "train"]
    evals = [[ev for run in runs for ev in run.evaluations()] for runs in groups[1:]]
    return Study(train, evals[0], evals[1] if len(evals) > 1 else [])


def _search_label(ev: Evaluation | None, method: str) -> str:
    particles = ev.results.get("particles") if ev else None
    name = SEARCH_LABELS.get(method, method)
    return f"{name}({particles})" if particles else name


def comparison_systems(study: Study, chosen: TrainingRun | None) -> list[System]:
    """Frozen greedy, frozen beam, Sample-Rerank, its paired Full IS selection, GrammarRL greedy
    (dev-chosen, and λ=0.5 N=3), and the searches with a trained proposal."""
    base = study.baselines
    greedy = paper_tables.pick(base, paper_tables.where(BASELINE, "greedy"))
    beam = paper_tables.pick(base, paper_tables.where(BASELINE, "beam"))
    rerank = paper_tables.pick(base, paper_tables.where("search/rerank"))
    width = beam.results.get("beam_width") if beam else None
    paired = (
        (rerank.results.get("selections") or {}).get("is", {}).get("scores") if rerank else None
    )
    is_reference = paper_tables.where(GRAMMARRL, "greedy", REFERENCE_LAMBDA)
    references = sorted(
        (r for r in study.train if r.greedy and is_reference(r.greedy) and r.n == REFERENCE_N),
        key=lambda r: r.label,
    )
    rows = [
        system("frozen greedy", greedy, "greedy"),
        system(f"frozen beam({width})" if width else "frozen beam", beam),
        system(_search_label(rerank, "rerank"), rerank, "rerank"),
        System(
            _search_label(rerank, "is") + ", paired on the rerank particles",
            rerank,
            tuple(float(s) for s in paired) if paired else None,
            "is",
        ),
        system(
            "GrammarRL greedy, dev-chosen" + (f" ({chosen.label})" if chosen else ""),
            chosen.greedy if chosen else None,
            "chosen",
        ),
    ]
    fixed = f"GrammarRL greedy, λ={format_number(REFERENCE_LAMBDA)}, N={REFERENCE_N}"
    rows += [system(f"GrammarRL greedy, {r.label}", r.greedy) for r in references] or [
        system(fixed, None)
    ]
    return rows + proposal_systems(study)


def proposal_systems(study: Study) -> list[System]:
    """One row per (method, particles, adapter) of the PROPOSAL sweep, the adapter named by the
    training run that wrote it."""
    searches = [ev for ev in study.proposal if ev.system.startswith("search/")]

    def key(ev: Evaluation) -> tuple[str, int, str]:
        return (
            str(ev.get("search.method")),
            int(ev.results.get("particles") or 0),
            str(ev.results.get("adapter") or ""),
        )

    rows = []
    for method, particles, adapter in sorted({key(ev) for ev in searches}):
        ev = paper_tables.pick(searches, lambda e, k=(method, particles, adapter): key(e) == k)
        name = f"{SEARCH_LABELS.get(method, method).removeprefix('Full ')}({particles})"
        if adapter:
            name += f" with the trained proposal ({_adapter_owner(study.train, adapter)})"
        else:
            name += " with the frozen proposal"
        rows.append(system(name, ev))
    return rows


def _adapter_owner(runs: Sequence[TrainingRun], adapter: str) -> str:
    """The training run whose adapter a search used (λ, N), else the adapter's run directory."""
    target = Path(adapter).resolve()
    owner = next((r for r in runs if (r.run.path / "adapter").resolve() == target), None)
    return owner.label if owner else target.parent.name


def check_test_sets(systems: Sequence[System]) -> None:
    """Refuse rows scored on other test sets (task, split seed, number, size, seed)."""
    groups: dict[tuple[Any, ...], list[System]] = {}
    for row in systems:
        if row.evaluation is not None:
            key = tuple(row.evaluation.get(k) for k in TEST_SET_KEYS)
            key += (len(row.scores or ()),)
            groups.setdefault(key, []).append(row)
    if len(groups) > 1:
        lines = [
            f"{', '.join(f'{k}={v}' for k, v in zip((*TEST_SET_KEYS, 'sets scored'), key))}"
            ": " + "; ".join(f"{row.label} ({row.evaluation.run.path})" for row in rows)
            for key, rows in groups.items()
        ]
        raise AggregationError(
            "the compared rows were evaluated on different test sets:\n  " + "\n  ".join(lines)
        )


def _listed(values: Sequence[float], signed: bool = False) -> str:
    return ", ".join(f"{v:+.3f}" if signed else f"{v:.3f}" for v in values)


def paired_cells(row: System, reference: System) -> list[Cell]:
    """(mean ± std of the per-set differences row − reference, the differences themselves)."""
    if row is reference or not (row.present and reference.present):
        return [Cell(), Cell()]
    diffs = [a - b for a, b in zip(row.scores, reference.scores)]
    return [Cell(*mean_std(diffs)), Cell(text=_listed(diffs, signed=True))]


def _test_sets_text(systems: Sequence[System]) -> str:
    ev = next((row.evaluation for row in systems if row.evaluation is not None), None)
    if ev is None:
        return "test sets"
    return (
        f"{ev.get('eval.num_test_sets')} test sets of {ev.get('eval.test_size')} (seed "
        f"{ev.get('seed')})"
    )


def comparison_table(systems: Sequence[System]) -> Table:
    greedy, rerank = by_role(systems, "greedy"), by_role(systems, "rerank")
    metric = metric_label(next((r.evaluation.metric for r in systems if r.evaluation), "metric"))
    rows = []
    for row in systems:
        if not row.present:
            rows.append(Row(row.label, [Cell(text=MISSING)] + [Cell() for _ in range(6)]))
            continue
        rows.append(
            Row(
                row.label,
                [
                    Cell(*mean_std(row.scores)),
                    Cell(text=_listed(row.scores)),
                    *paired_cells(row, greedy),
                    *paired_cells(row, rerank),
                ],
            )
        )
    return Table(
        "comparison",
        f"Evidence II on {_test_sets_text(systems)}: {metric}, mean ± std over test sets, and "
        "each set; diff.: paired per-set difference (row - reference), mean ± std over sets, and "
        f"each set. {by_role(systems, 'is').label.split(',')[0]} selects among the particles of "
        f"{rerank.label}. The dev-chosen GrammarRL run was chosen on dev {metric} only.",
        [
            "System",
            metric,
            "per set",
            "diff. vs frozen greedy",
            "per set",
            f"diff. vs {rerank.label}",
            "per set",
        ],
        [Block(rows)],
    ).mark_best()


# --- rewards of what each system emits ----------------------------------------------------------


@dataclass(frozen=True)
class Sigmas:
    direct: float
    reverse: float
    source: str


def training_sigmas(ev: Evaluation) -> Sigmas | None:
    """The σ's a training run trained with: set in its config, else recorded in its last
    checkpoint, else its entry of the calibration file (`reward.calibration_file`) measured
    under its conditions; None when none is found."""
    direct, reverse = ev.get("reward.sigma_direct"), ev.get("reward.sigma_reverse")
    if direct is not None and reverse is not None:
        return Sigmas(float(direct), float(reverse), "set in the run's config")
    checkpoint = ev.run.path / "checkpoints" / "last.ckpt"
    if checkpoint.is_file():
        from grammarrl.callbacks import RUN_RECORD  # lightning: only when needed
        from grammarrl.train import read_checkpoint

        try:
            record = read_checkpoint(checkpoint).get(RUN_RECORD) or {}
        except GrammarRLError:
            record = {}
        if record.get("sigmas"):
            return Sigmas(*map(float, record["sigmas"]), f"recorded in {checkpoint}")
    return calibrated_sigmas(ev)


def calibrated_sigmas(ev: Evaluation) -> Sigmas | None:
    """The run's calibration-file entry: its task/model/nN_bB key, measured under the run's
    conditions (the dtype as its results record it)."""
    path = locate(ev.get("reward.calibration_file"), ev.run.path)
    config = ev.results.get("config") or {}
    if path is None or not config:
        return None
    cfg = OmegaConf.create(config)
    try:
        cfg.device = "cpu"  # the dtype comes from the results, not from this machine
        cfg.model.dtype = str(ev.results.get("dtype") or "float32")
        conditions = calibration_conditions(cfg)
        key = calibration_key(cfg)
    except (OmegaConfBaseException, GrammarRLError):
        return None
    if not ev.results.get("dtype"):
        conditions.pop("dtype")
    found = [
        e for e in entries(json.loads(path.read_text()), key) if not differences(e, conditions)
    ]
    if not found:
        return None
    return Sigmas(
        float(found[-1]["sigma_direct"]),
        float(found[-1]["sigma_reverse"]),
        f"{os.path.relpath(path)} [{key}]",
    )


def locate(name: str | None, run_path: Path) -> Path | None:
    """A file named in a run's config: absolute, or relative to the directory the sweep was
    launched from (the current one, or one holding the run); else a file of that name archived
    beside the run's sweep (in a directory holding the run: committed results)."""
    if not name:
        return None
    path = Path(name)
    ancestors = run_path.resolve().parents
    bases = [Path()] if path.is_absolute() else [Path.cwd(), *ancestors]
    candidates = [base / path for base in bases] + [base / path.name for base in ancestors]
    return next((c for c in candidates if c.is_file()), None)


def mechanism_table(
    systems: Sequence[System], chosen: TrainingRun | None, sigmas: Sigmas | None
) -> Table:
    """Per scored system: its metric, mean R_direct and R_reverse of its outputs, and the
    combined reward at λ=0.5 and at the chosen λ under the chosen run's σ's."""
    lambdas = [REFERENCE_LAMBDA]
    if chosen is not None and abs(chosen.lam - REFERENCE_LAMBDA) > 1e-9:
        lambdas.append(chosen.lam)
    metric = metric_label(next((r.evaluation.metric for r in systems if r.evaluation), "metric"))
    header = ["System", metric, "R_direct", "R_reverse"] + [
        f"combined, λ={format_number(lam)}" + (" (chosen)" if chosen and lam == chosen.lam else "")
        for lam in lambdas
    ]
    rows = []
    for row in systems:
        if row.paired_selection:
            continue
        rewards = row.rewards()
        if not row.present:
            rows.append(Row(row.label, [Cell(text=MISSING)] + [Cell() for _ in header[2:]]))
            continue
        cells = [Cell(*mean_std(row.scores))]
        if rewards is None:
            cells += [Cell(text="not scored")] + [Cell() for _ in header[3:]]
        else:
            cells += [
                Cell(*mean_std([d for d, _ in rewards])),
                Cell(*mean_std([r for _, r in rewards])),
            ]
            cells += [
                Cell(
                    *mean_std(
                        [
                            combine_rewards(d, r, lam, sigmas.direct, sigmas.reverse)
                            for d, r in rewards
                        ]
                    )
                )
                if sigmas
                else Cell()
                for lam in lambdas
            ]
        rows.append(Row(row.label, cells))
    if sigmas is not None and chosen is not None:
        basis = (
            f"the σ's of the chosen run's (N={chosen.n}, B={chosen.greedy.beam_width}) "
            f"calibration, σ_direct={sigmas.direct:.4f}, σ_reverse={sigmas.reverse:.4f} "
            f"({sigmas.source})"
        )
    else:
        basis = (
            "no σ's: no training run has finished"
            if chosen is None
            else f"no σ's found for the chosen run {chosen.run.path}"
        )
    table = Table(
        "mechanism",
        "Evidence II, rewards of each system's test outputs under the frozen reference: mean "
        "R_direct and R_reverse over a set's outputs with tokens, then mean ± std over test "
        "sets; combined = (1-λ) R_direct/σ_direct + λ R_reverse/σ_reverse with "
        + basis
        + ". The paired IS selection is not listed: its outputs were not scored.",
        header,
        [Block(rows)],
        best=None,
    )
    table.notes.extend(_mechanism_notes(systems, lambdas, sigmas))
    return table


def _mechanism_notes(
    systems: Sequence[System], lambdas: Sequence[float], sigmas: Sigmas | None
) -> list[str]:
    """GrammarRL (dev-chosen) − frozen greedy: the change in reward next to the change in F1."""
    greedy, trained = by_role(systems, "greedy"), by_role(systems, "chosen")
    ours, theirs = trained.rewards(), greedy.rewards()
    if sigmas is None or ours is None or theirs is None:
        return []
    gain = mean_std(trained.scores)[0] - mean_std(greedy.scores)[0]
    parts = [f"{metric_label(trained.evaluation.metric)} {gain:+.3f}"]
    for lam in lambdas:
        gain = [
            combine_rewards(d, r, lam, sigmas.direct, sigmas.reverse)
            - combine_rewards(d0, r0, lam, sigmas.direct, sigmas.reverse)
            for (d, r), (d0, r0) in zip(ours, theirs)
        ]
        parts.append(f"combined reward at λ={format_number(lam)} {mean_std(gain)[0]:+.3f}")
    return [f"{trained.label} minus frozen greedy (mean over test sets): " + ", ".join(parts) + "."]


# --- figure -------------------------------------------------------------------------------------

PANELS = (
    ("train/reward", True),
    ("train/kl", True),
    ("train/validity", True),
    ("val/dev_{metric}", False),
    ("val/dev_empty_field_rate", False),
    ("val/dev_reward", False),
)


def training_curves(runs: Sequence[TrainingRun], path: Path) -> Path | None:
    """Train reward, KL and validity (moving averages) and dev metric, empty fields and reward
    against the training step, one line per run; None when nothing was logged."""
    panels = []
    for key, smooth in PANELS:
        key = key.format(metric=runs[0].metric) if runs else key
        lines = {}
        for run in sorted(runs, key=lambda r: (r.lam, r.n)):
            points = curve(run.series, key)
            lines[run.label] = moving_average(points) if smooth else points
        title = f"{key} (moving avg. {SMOOTH} steps)" if smooth else key
        if key == "val/dev_reward":
            title += " (own λ, σ's)"
        panels.append((title, {label: p for label, p in lines.items() if p}))
    if not any(lines for _, lines in panels):
        return None
    return figures.panel_grid(panels, path)


def build(sweep: Sweep, out: Path) -> tuple[list[Table], list[Path]]:
    """The study's tables (dev_selection, comparison, mechanism) and its training-curves figure
    (written into `out`). Raises AggregationError when rows were scored on other test sets."""
    study = load_study(sweep)
    chosen = choose(study.train)
    systems = comparison_systems(study, chosen)
    check_test_sets(systems)
    sigmas = training_sigmas(chosen.greedy) if chosen else None
    built = [
        dev_selection_table(study.train, chosen),
        comparison_table(systems),
        mechanism_table(systems, chosen, sigmas),
    ]
    png = training_curves(study.train, out / "training_curves_evidence2.png")
    return built, [png] if png else []
