"""Evidence II: does GrammarRL's greedy output beat the frozen model's on SmolLM2 / CoNLL, and
when it does not, is it because training did not raise the reward of greedy's outputs or because
a higher reward does not mean a higher F1?

Three sweeps (`conf/experiment/evidence2_*_cpu.yaml`), aggregated by role: TRAIN (`mode=train`,
λ x N; or adapters evaluated on their own, `mode=eval eval.adapter=DIR`, then there is no dev
choice), BASELINES (frozen greedy, frozen beam, Sample-Rerank, whose results also hold the paired
Full IS selection on the same particles, `selections.is`) and, optionally, PROPOSAL (IS with a
trained adapter as the proposal). This module says which rows and tables; the building blocks
(dev selection, systems, paired bootstrap, mechanism, outputs, seeds, curves) do the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments import systems as compared
from experiments.curves import training_curves
from experiments.dev_selection import choose, dev_selection_table
from experiments.mechanism import mechanism_table
from experiments.outputs import outputs_table
from experiments.runs import BASELINE, GRAMMARRL, AggregationError, Evaluation, Sweep, pick, where
from experiments.runs import format_number as number
from experiments.seeds import seeds_table
from experiments.sigmas import training_sigmas
from experiments.system_keys import SEARCH_NAMES
from experiments.systems import System, by_role, system
from experiments.table_format import Table
from experiments.training_runs import TrainingRun, adapter_owner, by_setting, distinct, training_run

TITLE = "Evidence II"
FIGURE = "training_curves_evidence2.png"
REFERENCE_LAMBDA = 0.5  # the paper's default λ: a fixed GrammarRL row and a combined-reward column
REFERENCE_N = 3  # ... and its N
USAGE = "evidence2 takes TRAIN_SWEEP BASELINES_SWEEP [PROPOSAL_SWEEP]"


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
    name = SEARCH_NAMES.get(method, method)
    return f"{name}({particles})" if particles else name


def baseline_systems(baselines: list[Evaluation]) -> list[System]:
    """Frozen greedy, frozen beam, Sample-Rerank and its paired Full IS selection."""
    greedy = pick(baselines, where(BASELINE, "greedy"))
    beam = pick(baselines, where(BASELINE, "beam"))
    rerank = pick(baselines, where("search/rerank"))
    width = beam.results.get("beam_width") if beam else None
    paired = (
        (rerank.results.get("selections") or {}).get("is", {}).get("scores") if rerank else None
    )
    label = _search_label(rerank, "is") + ", paired on the rerank particles"
    scores = tuple(float(s) for s in paired) if paired else None
    return [
        system("frozen greedy", greedy, "greedy"),
        system(f"frozen beam({width})" if width else "frozen beam", beam),
        system(_search_label(rerank, "rerank"), rerank, "rerank"),
        System(label, rerank, scores, "is", paired_selection=True),
    ]


def trained_systems(study: Study, chosen: TrainingRun | None) -> list[System]:
    """GrammarRL greedy: dev-chosen first, then every other finished training run (other
    training seeds last), the dev-best steps evaluated besides the last, adapters evaluated on
    their own (without training runs the first is the system under test), and a missing
    λ=0.5 N=3 row where there are training runs but none at that setting."""
    rows = []
    if study.train:
        label = "GrammarRL greedy, dev-chosen" + (f" ({chosen.label})" if chosen else "")
        rows.append(system(label, chosen.greedy if chosen else None, "chosen"))
    others = sorted(
        (r for r in study.train if r.finished and r is not chosen),
        key=lambda r: (r.other_seed, r.lam, r.n, r.label),
    )
    rows += [system(f"GrammarRL greedy, {r.label}", r.greedy) for r in others]
    trained = [r for r in [chosen, *others] if r]
    rows += [
        system(f"GrammarRL greedy, {r.label}, dev-best step {r.best_dev_step}", r.best_dev)
        for r in trained
        if r.best_dev is not None
    ]
    rows += [
        system(
            f"GrammarRL greedy, adapter {adapter_owner(study.train, _adapter(ev))}",
            ev,
            "" if study.train or index else "chosen",
        )
        for index, ev in enumerate(study.adapters)
    ]
    is_reference = where(GRAMMARRL, "greedy", REFERENCE_LAMBDA)
    if study.train and not any(r.n == REFERENCE_N and is_reference(r.greedy) for r in trained):
        fixed = f"GrammarRL greedy, λ={number(REFERENCE_LAMBDA)}, N={REFERENCE_N}"
        rows.append(system(fixed, None))
    return rows


def proposal_systems(study: Study) -> list[System]:
    """One row per (method, particles, adapter) of the PROPOSAL sweep, the adapter named by the
    training run that wrote it."""
    searches = [ev for ev in study.proposal if ev.system.startswith("search/")]

    def key(ev: Evaluation) -> tuple[str, int, str]:
        particles = int(ev.results.get("particles") or 0)
        return (str(ev.get("search.method")), particles, str(ev.results.get("adapter") or ""))

    rows = []
    for method, particles, adapter in sorted({key(ev) for ev in searches}):
        ev = pick(searches, lambda e, k=(method, particles, adapter): key(e) == k)
        name = f"{SEARCH_NAMES.get(method, method).removeprefix('Full ')}({particles})"
        if adapter:
            name += f" with the trained proposal ({adapter_owner(study.train, adapter)})"
        else:
            name += " with the frozen proposal"
        rows.append(system(name, ev))
    return rows


def _adapter(ev: Evaluation) -> str:
    return str(ev.results.get("adapter") or ev.get("eval.adapter"))


def _comparison_caption(systems: list[System], rerank: System) -> str:
    metric = compared.metric_of(systems)
    paired = by_role(systems, "is").label.split(",")[0]
    return (
        f"{TITLE} on {compared.sets_text(systems)}: {metric}, mean ± std over test sets, and "
        "each set; diff.: paired per-set difference (row - reference), mean ± std over sets, and "
        f"each set. {paired} selects among the particles of {rerank.label}. The dev-chosen "
        f"GrammarRL run was chosen on dev {metric} only."
    )


def build(sweep: Sweep, out: Path) -> tuple[list[Table], list[Path]]:
    """The study's tables (dev_selection, comparison, mechanism; training_seeds where a setting
    was trained with several seeds, outputs and paired_bootstrap where the task counts
    entities) and its training-curves figure (written into `out`). Raises AggregationError when
    rows were scored on other test sets."""
    study = load_study(sweep)
    chosen = choose(study.train)
    systems = baseline_systems(study.baselines) + trained_systems(study, chosen)
    systems += proposal_systems(study)
    compared.check_test_sets(systems)
    references = [by_role(systems, "greedy"), by_role(systems, "rerank")]
    under_test = by_role(systems, "chosen")  # the dev-chosen run's, or the adapter's
    sigmas = training_sigmas(under_test.evaluation) if under_test.evaluation else None
    lambdas = [REFERENCE_LAMBDA]
    if chosen is not None and abs(chosen.lam - REFERENCE_LAMBDA) > 1e-9:
        lambdas.append(chosen.lam)
    built = [dev_selection_table(study.train, chosen, TITLE)] if study.train else []
    caption = _comparison_caption(systems, references[1])
    built += [
        compared.comparison_table(systems, references, caption),
        mechanism_table(systems, references[0], under_test, chosen, sigmas, lambdas, TITLE),
    ]
    extra = (
        seeds_table(study.train, references, TITLE),
        outputs_table(systems, references, TITLE),
        compared.bootstrap_table(systems, references, TITLE),
    )
    built += [table for table in extra if table is not None]
    series = {run.label: run.series for run in by_setting(study.train)}
    metric_name = study.train[0].metric if study.train else ""
    png = training_curves(series, metric_name, out / FIGURE)
    return built, [png] if png else []
