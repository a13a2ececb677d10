"""Aggregate sweep outputs into the paper's tables (Markdown + LaTeX) and figures (PNG).

    python -m experiments.aggregate REPORT SWEEP_DIR [SWEEP_DIR ...] [--out DIR]
    python -m experiments.aggregate evidence2 TRAIN_SWEEP BASELINES_SWEEP [PROPOSAL_SWEEP]

REPORT is one of: sweep (any sweep, one row per evaluation), main, ablation_lambda,
ablation_rollout, calibration, inference_time, evidence2 (the sweeps by role, in that order;
experiments/studies/evidence2.py), compare (systems across results files by distinct test set, with
--reference LABEL and --label LABEL=TEXT; experiments/compare.py). Everything is computed from
the runs' results files, predictions and logged metrics. Runs without results (failed or
unfinished jobs), and dev-only training runs (`train.eval_test=false`: no test evaluation), are
listed in `runs.md` and on stderr. Output goes to
`<first SWEEP_DIR>/aggregate/` by default.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments import analysis, compare, figures, paper_tables
from experiments.runs import (
    BASELINE,
    GRAMMARRL,
    NO_TEST,
    AggregationError,
    Evaluation,
    Run,
    Sweep,
    load_sweep,
    where,
)
from experiments.studies import evidence2
from experiments.table_format import Block, Cell, Row, Table, to_latex, to_markdown
from grammarrl.tasks import gloss


def write_table(table: Table, out: Path) -> list[Path]:
    """`<out>/<name>.md` and `<out>/<name>.tex`."""
    out.mkdir(parents=True, exist_ok=True)
    md, tex = out / f"{table.name}.md", out / f"{table.name}.tex"
    md.write_text(to_markdown(table), encoding="utf-8")
    tex.write_text(to_latex(table), encoding="utf-8")
    return [md, tex]


def runs_listing(
    runs: Sequence[Run], finished: Callable[[Run], bool], roots: Sequence[Path]
) -> str:
    """Markdown list of every run with its status, wall time and configuration. The wall time
    is the job's last complete attempt (`timing.json`): a resumed training run's earlier
    attempts, or the run its checkpoint came from, are not in it; the time of its steps is
    (the step timings in its metrics, which carry over resumes)."""
    header = (
        "| run | status | wall time (last attempt) | steps logged (their time) | configuration |"
    )
    lines = [header, "|---|---|---|---|---|"]
    for run in runs:
        rel = next(
            (str(run.path.relative_to(r)) for r in roots if run.path.is_relative_to(r)),
            str(run.path),
        )
        status = "ok" if finished(run) else "**missing**"
        if finished(run) and run.untested:
            status = f"ok, {NO_TEST}"
        if not finished(run) and run.failure:
            error = " ".join(run.failure.split()).replace("|", "\\|")[:300]
            status = f"**failed**: {error}"
        wall = run.wall_seconds
        wall_text = f"{wall / 60:.1f} min" if wall is not None else "–"
        lines.append(
            f"| {rel or '.'} | {status} | {wall_text} | {step_time(run)} | {run.describe()} |"
        )
    return "\n".join(lines) + "\n"


def step_time(run: Run) -> str:
    """`360 (114.2 min)`: the steps a training run logged a timing for and the sum of those
    timings (`perf/step_seconds`; a step logged twice, redone after a resume, counts once;
    runs resumed under older versions lack a step at each resume); `–` for other
    runs."""
    if run.mode != "train":
        return "–"
    timings = dict(analysis.read_metrics(run).get("perf/step_seconds", []))
    if not timings:
        return "–"
    return f"{len(timings)} ({sum(timings.values()) / 60:.1f} min)"


def curves_figure(
    evals: Sequence[Evaluation], out: Path, name: str, label: Callable[[Evaluation], str]
) -> list[Path]:
    """Train/dev curves of the training runs behind `evals` (greedy results only)."""
    curves, metric_names = [], {}
    for ev in evals:
        if ev.mode != "train" or ev.name != "results":
            continue
        series = analysis.read_metrics(ev.run)
        train, dev = (
            series.get(f"val/train_{ev.metric}", []),
            series.get(f"val/dev_{ev.metric}", []),
        )
        if len(dev) < 2:
            print(
                f"note: {ev.run.path} was validated at {len(dev)} step(s), so {name}.png has "
                f"no dev line for it (trainer.val_check_interval={ev.get('trainer.val_check_interval')}"
                f", trainer.max_steps={ev.get('trainer.max_steps')})",
                file=sys.stderr,
            )
        if train or dev:
            curves.append(figures.Curve(ev.task, label(ev), train, dev))
            metric_names[ev.task] = ev.metric
    if not curves:
        return []
    return [figures.training_curves(curves, out / f"{name}.png", metric_names)]


def _first_model(evals: Sequence[Evaluation]) -> list[Evaluation]:
    models = paper_tables.models_of(evals)
    return [ev for ev in evals if models and ev.model == models[0]]


def report_sweep(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    keys = paper_tables.sweep_keys(evals)
    return write_table(paper_tables.sweep_table(evals), out) + curves_figure(
        evals, out, "training_curves", lambda ev: paper_tables.sweep_label(ev, keys)
    )


def report_main(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    written = write_table(paper_tables.main_table(evals), out)
    trained = [
        ev
        for ev in _first_model(evals)
        if where(GRAMMARRL, "greedy", rollout=paper_tables.DEFAULT_ROLLOUT)(ev)
    ]
    return written + curves_figure(
        trained, out, "training_curves", lambda ev: f"λ={paper_tables.lambda_label(ev.lam)}"
    )


def report_lambda(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    written = write_table(paper_tables.lambda_table(evals), out)
    model_evals = _first_model(evals)
    trained = {ev.task: [] for ev in model_evals}
    for ev in model_evals:
        if where(GRAMMARRL, "greedy", rollout=paper_tables.DEFAULT_ROLLOUT)(ev):
            trained[ev.task].append(ev)
    baselines = _baselines(args, model_evals)
    if trained.get("conll"):
        written += conll_empty_fields(trained["conll"], baselines.get("conll", []), out)
    if trained.get("gloss"):
        written += gloss_trap_tokens(trained["gloss"], out)
    return written


def _baselines(args: argparse.Namespace, evals: list[Evaluation]) -> dict[str, list[Evaluation]]:
    """Frozen-model evaluations (from --baselines sweeps, else from the sweep itself)."""
    pool = load_sweep(args.baselines).evaluations() if args.baselines else evals
    model = evals[0].model if evals else None
    found: dict[str, list[Evaluation]] = {}
    for ev in pool:
        if ev.system == BASELINE and ev.model == model:
            found.setdefault(ev.task, []).append(ev)
    return found


def conll_empty_fields(
    trained: list[Evaluation], baselines: list[Evaluation], out: Path
) -> list[Path]:
    """Paper Figure "CoNLL empty fields and micro-F1 against λ" (+ its numbers as a table)."""
    points = []
    for ev in sorted(trained, key=lambda e: e.lam):
        rate = analysis.per_set_mean(analysis.read_predictions(ev), analysis.empty_field_rate)
        points.append(figures.LambdaPoint(float(ev.lam), {"empty": rate, "f1": ev.summary()}))
    lines: dict[str, dict[str, float]] = {"empty": {}, "f1": {}}
    for ev in baselines:
        name = ev.decoding
        lines["empty"][name] = analysis.per_set_mean(
            analysis.read_predictions(ev), analysis.empty_field_rate
        )[0]
        lines["f1"][name] = ev.summary()[0]
    png = figures.against_lambda(
        points,
        [("empty", "gold fields left empty (%)"), ("f1", "micro-F1")],
        out / "conll_empty_fields.png",
        lines,
        title="CoNLL: empty-field errors and micro-F1 vs λ",
    )
    rows = [
        Row(paper_tables.lambda_label(p.lam), [Cell(*p.values["empty"]), Cell(*p.values["f1"])])
        for p in points
    ]
    base_rows = [
        Row(f"frozen ({name})", [Cell(lines["empty"][name]), Cell(lines["f1"][name])])
        for name in lines["f1"]
    ]
    table = Table(
        "conll_empty_fields",
        "CoNLL: percentage of gold non-empty fields left empty, "
        "and micro-F1, against λ (mean ± std over test sets).",
        ["λ", "empty fields (%)", "micro-F1"],
        [Block(rows)] + ([Block(base_rows)] if base_rows else []),
        best=None,
    )
    return [png, *write_table(table, out)]


def gloss_trap_tokens(trained: list[Evaluation], out: Path) -> list[Path]:
    """Paper Table/analysis "trap tokens in gloss predictions" against λ (+ a figure)."""
    terms = [*gloss.TRAP_TERMS, gloss.BARE_X]
    points = []
    for ev in sorted(trained, key=lambda e: e.lam):
        rows = analysis.read_predictions(ev)
        points.append(
            figures.LambdaPoint(
                float(ev.lam),
                {term: analysis.per_set_mean(rows, analysis.term_count(term)) for term in terms},
            )
        )
    table = Table(
        "gloss_trap_tokens",
        "Trap tokens in gloss predictions against λ: mean occurrences per test set; bold: lowest.",
        ["λ", *terms[:-1], "bare X"],
        [
            Block(
                [
                    Row(paper_tables.lambda_label(p.lam), [Cell(p.values[t][0]) for t in terms])
                    for p in points
                ]
            )
        ],
        best="min",
        digits=1,
    ).mark_best()
    png = figures.against_lambda(
        points,
        [(t, f"{t} per test set") for t in terms],
        out / "gloss_trap_tokens.png",
        title="Gloss: trap tokens vs λ",
    )
    return [*write_table(table, out), png]


def report_rollout(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    return write_table(paper_tables.rollout_table(evals), out)


def report_inference(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    return write_table(paper_tables.inference_table(evals, args.num_sets), out)


def report_evidence2(sweep: Sweep, out: Path) -> list[Path]:
    """dev_selection, comparison, mechanism, training_seeds and outputs where they apply (.md,
    .tex) and training_curves_evidence2.png."""
    built, pngs = evidence2.build(sweep, out)
    return [path for table in built for path in write_table(table, out)] + pngs


REPORTS = {
    "sweep": report_sweep,
    "main": report_main,
    "ablation_lambda": report_lambda,
    "ablation_rollout": report_rollout,
    "inference_time": report_inference,
    "calibration": None,  # built from calibration entries, not evaluations
    "evidence2": None,  # built from its sweeps by role (report_evidence2), unfinished runs too
    "compare": compare.report,
}


def aggregate(
    report: str,
    dirs: Sequence[str | Path],
    out: Path | None = None,
    baselines: Sequence[str] = (),
    num_sets: int | None = None,
    reference: Sequence[str] = (),
    label: Sequence[str] = (),
) -> list[Path]:
    """Write the report's tables and figures plus `runs.md`; returns the files written."""
    if report not in REPORTS:
        raise AggregationError(f"unknown report {report!r}: one of {', '.join(REPORTS)}")
    sweep = load_sweep(list(dirs))
    out = Path(out) if out else sweep.roots[0] / "aggregate"
    args = argparse.Namespace(
        baselines=list(baselines), num_sets=num_sets, reference=list(reference), label=list(label)
    )
    if report == "calibration":
        entries = {id(run): analysis.calibration_entry(run) for run in sweep.runs}
        finished = lambda run: entries[id(run)] is not None
        found = [e for e in entries.values() if e is not None]
        if not found:
            raise AggregationError(f"{', '.join(map(str, dirs))}: no calibration results found")
        written = write_table(paper_tables.calibration_table(found), out)
    elif report == "evidence2":
        finished = Run.finished.fget
        written = report_evidence2(sweep, out)
    else:
        finished = Run.finished.fget
        evals = sweep.evaluations()
        untested = sum(run.untested for run in sweep.runs)
        if not evals:
            why = f"{untested} finished with {NO_TEST}" if untested else "all failed or unfinished?"
            raise AggregationError(
                f"{', '.join(map(str, dirs))}: {len(sweep.runs)} runs, none "
                f"with a results file of a test evaluation ({why})"
            )
        written = REPORTS[report](evals, out, args)
    listing = out / "runs.md"
    listing.write_text(runs_listing(sweep.runs, finished, sweep.roots), encoding="utf-8")
    for run in sweep.runs:
        if finished(run) and run.untested:
            print(f"{NO_TEST}: {run.path} ({run.describe()}), in no table", file=sys.stderr)
    missing = [run for run in sweep.runs if not finished(run)]
    for run in missing:
        failure = f": {run.failure}" if run.failure else ""
        print(
            f"{'failed' if failure else 'missing'}: {run.path} ({run.describe()}){failure}",
            file=sys.stderr,
        )
    return [*written, listing]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.aggregate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("report", choices=list(REPORTS))
    parser.add_argument(
        "dirs",
        nargs="+",
        help="sweep directories (multirun/<date>/<time>); evidence2: TRAIN BASELINES [PROPOSAL]",
    )
    parser.add_argument("--out", type=Path, help="output directory (default <first dir>/aggregate)")
    parser.add_argument(
        "--baselines",
        nargs="*",
        default=[],
        help="sweeps holding the frozen-model evaluations for reference lines",
    )
    parser.add_argument("--num-sets", type=int, help="use only the first k test sets of each run")
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        help="compare: a system label to compare against (repeatable; default frozen greedy "
        "and Sample-Rerank)",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        help="compare: LABEL=TEXT renames a system; systems renamed alike are pooled as one",
    )
    args = parser.parse_args(argv)
    try:
        written = aggregate(
            args.report,
            args.dirs,
            args.out,
            args.baselines,
            args.num_sets,
            args.reference,
            args.label,
        )
    except AggregationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    main_table = next((p for p in written if p.suffix == ".md" and p.name != "runs.md"), None)
    if main_table is not None:
        print(main_table.read_text(encoding="utf-8"))
    print("written:", *written, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
