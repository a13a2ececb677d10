"""Evidence II: does GrammarRL's greedy output beat the frozen model's on SmolLM2 / CoNLL, and
when it does not, is it because training did not raise the reward of greedy's outputs or because
a higher reward does not mean a higher F1?

Three sweeps (`conf/experiment/evidence2_*_cpu.yaml`), aggregated by role:

- TRAIN (`mode=train`, λ x N): the setting is chosen on the dev curves only (`dev_selection`);
  test numbers never enter the choice.
- BASELINES: frozen greedy, frozen beam, Sample-Rerank (whose results also hold the paired Full
  IS selection on the very same particles, `selections.is`).
- PROPOSAL (optional): IS with a trained adapter as the proposal, one job per particle count.

TRAIN may instead hold adapters evaluated on their own (`mode=eval eval.adapter=DIR`): a trained
adapter on other seeded test sets, next to the frozen rows on those sets. It then gets a row of
its own ("GrammarRL greedy, adapter DIR") and there is no dev choice.

`comparison` sets every system side by side on the same seeded test sets, with paired per-set
differences against frozen greedy and Sample-Rerank; `mechanism` gives the frozen reference's
rewards of what each system emits (`eval.score_rewards`) and the combined training reward they
make under the chosen run's σ's. A partial study aggregates: what is missing shows as missing.
The training runs and the dev-only choice live in `evidence_training`, the σ lookup in
`evidence_sigmas`, the systems' rows and the mechanism table in `evidence_mechanism`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.evidence_bootstrap import bootstrap_table
from experiments.evidence_mechanism import (
    MISSING,
    REFERENCE_LAMBDA,
    System,
    by_role,
    mechanism_table,
    system,
)
from experiments.evidence_outputs import outputs_table
from experiments.evidence_seeds import seeds_table
from experiments.evidence_sigmas import training_sigmas
from experiments.evidence_training import (
    TrainingRun,
    choose,
    dev_selection_table,
    distinct,
    metric_label,
    training_curves,
    training_run,
)
from experiments.runs import (
    BASELINE,
    GRAMMARRL,
    AggregationError,
    Evaluation,
    format_number,
    pick,
    where,
)
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.runs.results import mean_std

if TYPE_CHECKING:
    from experiments.runs import Sweep

REFERENCE_N = 3  # ... and its N
# What fixes the seeded test sets: rows that differ in any of these were scored on other sets.
TEST_SET_KEYS = (
    "task.name",
    "data.split_seed",
    "eval.num_test_sets",
    "eval.test_size",
    "eval.test_set_drawing",  # set i of one drawing is not set i of another
    "seed",
)
SEARCH_LABELS = {"rerank": "Sample-Rerank", "is": "Full IS", "smc": "Full SMC"}
USAGE = "evidence2 takes TRAIN_SWEEP BASELINES_SWEEP [PROPOSAL_SWEEP]"


# --- the systems compared on the test sets ------------------------------------------------------


@dataclass(frozen=True)
class Study:
    train: list[TrainingRun]
    baselines: list[Evaluation]
    proposal: list[Evaluation]
    adapters: list[Evaluation]  # trained adapters evaluated on their own, from the TRAIN root


def load_study(sweep: Sweep) -> Study:
    """The sweeps by role, in the order given: TRAIN, BASELINES, [PROPOSAL]."""
    if not 2 <= len(sweep.roots) <= 3:
        raise AggregationError(f"{USAGE}; got {len(sweep.roots)} directories")
    groups = [[run for run in sweep.runs if run.path.is_relative_to(root)] for root in sweep.roots]
    train = distinct([training_run(run) for run in groups[0] if run.mode == "train"])
    adapters = [
        ev
        for run in groups[0]
        if run.mode == "eval"
        for ev in run.evaluations()
        if ev.system == GRAMMARRL
    ]
    if not train and not adapters:
        raise AggregationError(
            f"{sweep.roots[0]}: no mode=train runs and no evaluated adapters ({USAGE})"
        )
    for root, runs, modes in zip(sweep.roots[1:], groups[1:], (("eval", "search"), ("search",))):
        if not any(run.mode in modes for run in runs):
            raise AggregationError(f"{root}: no mode={'/'.join(modes)} runs ({USAGE})")
    evals = [[ev for run in runs for ev in run.evaluations()] for runs in groups[1:]]
    return Study(train, evals[0], evals[1] if len(evals) > 1 else [], adapters)


def _search_label(ev: Evaluation | None, method: str) -> str:
    particles = ev.results.get("particles") if ev else None
    name = SEARCH_LABELS.get(method, method)
    return f"{name}({particles})" if particles else name


def comparison_systems(study: Study, chosen: TrainingRun | None) -> list[System]:
    """Frozen greedy, frozen beam, Sample-Rerank, its paired Full IS selection, GrammarRL greedy
    (dev-chosen first, then every other finished training run, other training seeds last, then
    the dev-best steps evaluated besides the last, then adapters evaluated on their own; a
    missing λ=0.5 N=3 run says so where there are training runs), and the searches with a
    trained proposal."""
    base = study.baselines
    greedy = pick(base, where(BASELINE, "greedy"))
    beam = pick(base, where(BASELINE, "beam"))
    rerank = pick(base, where("search/rerank"))
    width = beam.results.get("beam_width") if beam else None
    paired = (
        (rerank.results.get("selections") or {}).get("is", {}).get("scores") if rerank else None
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
    ]
    if study.train:
        label = "GrammarRL greedy, dev-chosen" + (f" ({chosen.label})" if chosen else "")
        rows.append(system(label, chosen.greedy if chosen else None, "chosen"))
    others = sorted(
        (r for r in study.train if r.finished and r is not chosen),
        key=lambda r: (r.other_seed, r.lam, r.n, r.label),
    )
    rows += [system(f"GrammarRL greedy, {r.label}", r.greedy) for r in others]
    rows += [
        system(f"GrammarRL greedy, {r.label}, dev-best step {r.best_dev_step}", r.best_dev)
        for r in [chosen, *others]
        if r is not None and r.best_dev is not None
    ]
    rows += [  # without training runs, the first adapter is the system under test
        system(
            f"GrammarRL greedy, adapter {_adapter_owner(study.train, _adapter(ev))}",
            ev,
            "" if study.train or index else "chosen",
        )
        for index, ev in enumerate(study.adapters)
    ]
    is_reference = where(GRAMMARRL, "greedy", REFERENCE_LAMBDA)
    trained = [r for r in [chosen, *others] if r]
    if study.train and not any(r.n == REFERENCE_N and is_reference(r.greedy) for r in trained):
        fixed = f"GrammarRL greedy, λ={format_number(REFERENCE_LAMBDA)}, N={REFERENCE_N}"
        rows.append(system(fixed, None))
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
        ev = pick(searches, lambda e, k=(method, particles, adapter): key(e) == k)
        name = f"{SEARCH_LABELS.get(method, method).removeprefix('Full ')}({particles})"
        if adapter:
            name += f" with the trained proposal ({_adapter_owner(study.train, adapter)})"
        else:
            name += " with the frozen proposal"
        rows.append(system(name, ev))
    return rows


def _adapter(ev: Evaluation) -> str:
    return str(ev.results.get("adapter") or ev.get("eval.adapter"))


def _adapter_owner(runs: Sequence[TrainingRun], adapter: str) -> str:
    """The training run whose adapter a search used (λ, N), else the adapter's run directory
    (`<run>/adapter`) or, for an adapter copied elsewhere, its own directory."""
    target = Path(adapter).resolve()
    owner = next((r for r in runs if (r.run.path / "adapter").resolve() == target), None)
    if owner:
        return owner.label
    return target.parent.name if target.name == "adapter" else target.name


def check_test_sets(systems: Sequence[System]) -> None:
    """Refuse rows scored on other test sets (task, split seed, number, size, seed) or with
    model weights in another dtype (`model.dtype=auto` differs between machines; a results file
    that does not record its dtype is taken as compatible)."""
    scored = [row for row in systems if row.evaluation is not None]
    for name, key_of in (
        ("different test sets", _test_set_key),
        ("another dtype", lambda row: row.evaluation.results.get("dtype")),
    ):
        groups: dict[Any, list[System]] = {}
        for row in scored:
            key = key_of(row)
            if key is not None:
                groups.setdefault(key, []).append(row)
        if len(groups) > 1:
            lines = [
                f"{_describe_key(key)}: "
                + "; ".join(f"{row.label} ({row.evaluation.run.path})" for row in rows)
                for key, rows in groups.items()
            ]
            raise AggregationError(
                f"the compared rows were evaluated on {name}:\n  " + "\n  ".join(lines)
            )


def _test_set_key(row: System) -> tuple[Any, ...]:
    values = tuple(row.evaluation.get(k) for k in TEST_SET_KEYS) + (len(row.scores or ()),)
    return tuple(zip((*TEST_SET_KEYS, "sets scored"), values))


def _describe_key(key: Any) -> str:
    if isinstance(key, tuple):
        return ", ".join(f"{k}={v}" for k, v in key)
    return f"dtype={key}"


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


def build(sweep: Sweep, out: Path) -> tuple[list[Table], list[Path]]:
    """The study's tables (dev_selection, comparison, mechanism; training_seeds where a setting
    was trained with several seeds, outputs and paired_bootstrap where the task counts
    entities) and its training-curves figure (written into `out`). Raises AggregationError when
    rows were scored on other test sets."""
    study = load_study(sweep)
    chosen = choose(study.train)
    systems = comparison_systems(study, chosen)
    check_test_sets(systems)
    under_test = by_role(systems, "chosen").evaluation  # the dev-chosen run's, or the adapter's
    sigmas = training_sigmas(under_test) if under_test else None
    built = [dev_selection_table(study.train, chosen)] if study.train else []
    built += [
        comparison_table(systems),
        mechanism_table(systems, chosen, sigmas),
    ]
    extra = (seeds_table(study.train, systems), outputs_table(systems), bootstrap_table(systems))
    built += [table for table in extra if table is not None]
    png = training_curves(study.train, out / "training_curves_evidence2.png")
    return built, [png] if png else []
