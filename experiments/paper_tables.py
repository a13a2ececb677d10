"""The paper's tables, built from evaluations (results files) of sweep runs.

Each builder selects evaluations by system, decoding, λ, N and B, and lays them out as the
paper does: tasks as columns, configurations as rows, mean ± std over test sets, best in bold.
Several evaluations matching one cell are an error unless they hold the same scores (the
frozen baseline evaluated by several runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.runs import (
    BASELINE,
    GRAMMARRL,
    Evaluation,
    Predicate,
    format_number,
    pick,
    where,
)
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.tasks import task_label

PAPER_TASK_ORDER = ("gloss", "wos", "conll")  # the paper's columns; other tasks follow by name
MODEL_ORDER = ("1b", "3b", "8b", "smollm2", "tiny")
DEFAULT_ROLLOUT = (3, 3)  # (N, B) of the paper's main results
DEFAULT_LAMBDA = 0.5


def score_cell(ev: Evaluation | None, num_sets: int | None = None) -> Cell:
    if ev is None:
        return Cell()
    mean, std = ev.summary(num_sets)
    return Cell(mean=mean, std=std)


def tasks_of(evals: Sequence[Evaluation]) -> list[str]:
    return _task_order({ev.task for ev in evals})


def _task_order(present: set[str]) -> list[str]:
    return [t for t in PAPER_TASK_ORDER if t in present] + sorted(present - set(PAPER_TASK_ORDER))


def models_of(evals: Sequence[Evaluation]) -> list[str]:
    present = {ev.model for ev in evals}
    return [m for m in MODEL_ORDER if m in present] + sorted(present - set(MODEL_ORDER))


def _header(first: str, tasks: Sequence[str]) -> list[str]:
    return [first, *map(task_label, tasks)]


@dataclass(frozen=True)
class RowSpec:
    label: str
    predicate: Predicate
    shaded: bool = False


def _task_rows(
    evals: Sequence[Evaluation],
    tasks: Sequence[str],
    specs: Sequence[RowSpec],
    num_sets: int | None = None,
) -> list[Row]:
    """One row per spec, one cell per task."""
    return [
        Row(
            spec.label,
            [
                score_cell(
                    pick(evals, lambda ev, t=t, s=spec: ev.task == t and s.predicate(ev)), num_sets
                )
                for t in tasks
            ],
            shaded=spec.shaded,
        )
        for spec in specs
    ]


def _model_label(model: str) -> str:
    return model.upper() if model[:-1].isdigit() else model


def lambda_label(lam: float) -> str:
    suffix = {0.0: " (direct only)", 1.0: " (reverse only)"}.get(float(lam), "")
    return format_number(lam) + suffix


def main_table(evals: Sequence[Evaluation], rollout: tuple[int, int] = DEFAULT_ROLLOUT) -> Table:
    """Paper Table "main results": per model, baseline greedy/beam, reverse-only, direct-only,
    GrammarRL (λ=0.5) greedy and beam."""
    tasks = tasks_of(evals)
    specs = [
        RowSpec("baseline (greedy)", where(BASELINE, "greedy")),
        RowSpec("baseline (beam)", where(BASELINE, "beam")),
        RowSpec("GrammarRL (reverse only)", where(GRAMMARRL, "greedy", 1.0, rollout)),
        RowSpec("GrammarRL (direct only)", where(GRAMMARRL, "greedy", 0.0, rollout)),
        RowSpec("GrammarRL", where(GRAMMARRL, "greedy", DEFAULT_LAMBDA, rollout)),
        RowSpec("GrammarRL (beam)", where(GRAMMARRL, "beam", DEFAULT_LAMBDA, rollout)),
    ]
    blocks = []
    for model in models_of(evals):
        of_model = [ev for ev in evals if ev.model == model]
        blocks.append(Block(_task_rows(of_model, tasks, specs), title=_model_label(model)))
    return Table(
        "main_results",
        f"Main results, N={rollout[0]}, B={rollout[1]}: mean ± std over "
        "test sets; GrammarRL uses λ=0.5; beam rows decode with beam search.",
        _header("Config", tasks),
        blocks,
    ).mark_best()


def lambda_table(evals: Sequence[Evaluation], rollout: tuple[int, int] = DEFAULT_ROLLOUT) -> Table:
    """Paper Table "ablation on λ": one row per λ, greedy decoding, N and B fixed."""
    tasks = tasks_of(evals)
    blocks = []
    for model in models_of(evals):
        trained = [
            ev
            for ev in evals
            if ev.model == model and where(GRAMMARRL, "greedy", rollout=rollout)(ev)
        ]
        lambdas = sorted({float(ev.lam) for ev in trained if ev.lam is not None})
        specs = [RowSpec(lambda_label(lam), where(lam=lam)) for lam in lambdas]
        if specs:
            blocks.append(Block(_task_rows(trained, tasks, specs), title=_model_label(model)))
    return Table(
        "ablation_lambda",
        f"Ablation on λ (N={rollout[0]}, B={rollout[1]}, greedy): mean ± std over test sets.",
        _header("λ", tasks),
        blocks,
    ).mark_best()


def rollout_table(
    evals: Sequence[Evaluation],
    lam: float = DEFAULT_LAMBDA,
    default: tuple[int, int] = DEFAULT_ROLLOUT,
) -> Table:
    """Paper Table "rollout ablation": N with B fixed, then B with N fixed (λ fixed)."""
    tasks = tasks_of(evals)
    n0, b0 = default
    trained = [ev for ev in evals if where(GRAMMARRL, "greedy", lam)(ev)]
    blocks = []
    for model in models_of(trained):
        of_model = [ev for ev in trained if ev.model == model]
        ns = sorted({ev.num_samples for ev in of_model if ev.beam_width == b0})
        bs = sorted({ev.beam_width for ev in of_model if ev.num_samples == n0})
        prefix = f"{_model_label(model)}: " if len(models_of(trained)) > 1 else ""
        blocks.append(
            Block(
                [
                    *_task_rows(
                        of_model,
                        tasks,
                        [RowSpec(str(n), where(rollout=(n, b0)), shaded=n == n0) for n in ns],
                    )
                ],
                title=f"{prefix}Sampled sequences N (B={b0})",
            )
        )
        blocks.append(
            Block(
                _task_rows(
                    of_model,
                    tasks,
                    [RowSpec(str(b), where(rollout=(n0, b)), shaded=b == b0) for b in bs],
                ),
                title=f"{prefix}Beam width B (N={n0})",
            )
        )
    return Table(
        "ablation_rollout",
        f"Ablation on the rollout composition (λ={format_number(lam)},"
        " greedy): mean ± std over test sets; bold: best of each block.",
        _header("", tasks),
        blocks,
    ).mark_best()


def calibration_table(entries: Sequence[dict[str, Any]]) -> Table:
    """Paper Table "calibration": σ_direct, σ_reverse per task, (N, B) and model size."""
    models = [m for m in MODEL_ORDER if any(e["model"] == m for e in entries)]
    models += sorted({e["model"] for e in entries} - set(models))
    header = ["(N, B)"] + [
        f"{_model_label(m)} {s}" for m in models for s in ("σ_direct", "σ_reverse")
    ]
    blocks = []
    for task in _task_order({e["task"] for e in entries}):
        of_task = [e for e in entries if e["task"] == task]
        rows = []
        for n, b in _rollout_order({(e["n"], e["b"]) for e in of_task}):
            cells = []
            for model in models:
                entry = next(
                    (e for e in of_task if e["model"] == model and (e["n"], e["b"]) == (n, b)), None
                )
                cells += [
                    Cell(mean=entry[k]) if entry else Cell(text="–")
                    for k in ("sigma_direct", "sigma_reverse")
                ]
            rows.append(Row(f"({n},{b})", cells, shaded=(n, b) == DEFAULT_ROLLOUT))
        blocks.append(Block(rows, title=task_label(task).split(" ")[0]))
    return Table(
        "calibration",
        "Reward scaling constants σ_direct and σ_reverse per task, rollout "
        "composition (N, B) and model, measured by mode=calibrate on the dev inputs.",
        header,
        blocks,
        best=None,
        digits=4,
    )


def _rollout_order(pairs: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The paper's order: N varied with B=3, then B varied with N=3, then anything else."""
    n0, b0 = DEFAULT_ROLLOUT
    first = sorted(p for p in pairs if p[1] == b0)
    second = sorted(p for p in pairs if p[0] == n0 and p[1] != b0)
    return first + second + sorted(pairs - set(first) - set(second))


SEARCH_ROWS = (("rerank", "Sample-Rerank"), ("is", "Full IS"), ("smc", "Full SMC"))


def inference_table(
    evals: Sequence[Evaluation],
    num_sets: int | None = None,
    rollout: tuple[int, int] = DEFAULT_ROLLOUT,
) -> Table:
    """Paper Table "inference-time methods": baselines and search methods against GrammarRL at
    λ=0.5 and at the best λ per task (chosen on the same test sets, as in the paper). Cost is
    the generation time relative to one greedy pass of the frozen model on the same task."""
    tasks = tasks_of(evals)
    beam = next((ev for ev in evals if where(BASELINE, "beam")(ev)), None)
    beam_width = beam.results.get("beam_width") if beam else None
    specs = [
        RowSpec("Constrained greedy", where(BASELINE, "greedy")),
        RowSpec(f"Constrained beam (B={beam_width or '?'})", where(BASELINE, "beam")),
        *[RowSpec(label, where(f"search/{method}")) for method, label in SEARCH_ROWS],
        RowSpec("GrammarRL (λ=0.5)", where(GRAMMARRL, "greedy", DEFAULT_LAMBDA, rollout)),
    ]
    best = {task: _best_lambda(evals, task, num_sets, rollout) for task in tasks}
    best_spec = RowSpec(
        "GrammarRL (best λ)",
        lambda ev: (
            best.get(ev.task) is not None and where(GRAMMARRL, "greedy", best[ev.task], rollout)(ev)
        ),
    )
    rows = _task_rows(evals, tasks, [*specs, best_spec], num_sets)
    for row, spec in zip(rows, [*specs, best_spec]):
        row.cells.insert(0, Cell(text=_cost(evals, spec.predicate, tasks)))
    table = Table(
        "inference_time",
        "Inference-time methods vs GrammarRL: mean ± std over "
        f"{num_sets or 'all'} test sets; cost: generation time relative to one greedy "
        "pass.",
        ["Method", "Cost", *map(task_label, tasks)],
        [Block(rows[: len(specs) - 1]), Block(rows[len(specs) - 1 :])],
    )
    table.notes.append(
        "Best λ per task (selected on these test sets): "
        + ", ".join(f"{t} {format_number(lam)}" for t, lam in best.items() if lam is not None)
    )
    return table.mark_best()


def _best_lambda(
    evals: Sequence[Evaluation], task: str, num_sets: int | None, rollout: tuple[int, int]
) -> float | None:
    trained = [
        ev for ev in evals if ev.task == task and where(GRAMMARRL, "greedy", rollout=rollout)(ev)
    ]
    if not trained:
        return None
    return float(max(trained, key=lambda ev: ev.summary(num_sets)[0]).lam)


def _cost(evals: Sequence[Evaluation], predicate: Predicate, tasks: Sequence[str]) -> str:
    """Mean over tasks of greedy examples/s over this row's examples/s (or its own `cost`)."""
    ratios = []
    for task in tasks:
        ev = pick(evals, lambda e, t=task: e.task == t and predicate(e))
        greedy = pick(evals, lambda e, t=task: e.task == t and where(BASELINE, "greedy")(e))
        if ev is None:
            continue
        if "cost" in ev.results:
            ratios.append(float(ev.results["cost"]))
        elif greedy is not None and ev.results.get("examples_per_second"):
            ratios.append(greedy.results["examples_per_second"] / ev.results["examples_per_second"])
    if not ratios:
        return "–"
    ratio = sum(ratios) / len(ratios)
    text = "1×" if ratio < 1.5 else f"≈{ratio:.0f}×"
    trained = any(predicate(ev) and ev.system == GRAMMARRL for ev in evals)
    return text + (" (+ training)" if trained else "")


def _trained_here(ev: Evaluation) -> bool:
    return ev.system == GRAMMARRL and ev.mode == "train"


DESCRIPTORS: dict[str, Callable[[Evaluation], Any]] = {
    "task": lambda ev: ev.task,
    "model": lambda ev: ev.model,
    "system": lambda ev: ev.system,
    # training settings label the runs that trained (an eval job's own λ is not its adapter's)
    "λ": lambda ev: format_number(ev.lam) if _trained_here(ev) else None,
    "N": lambda ev: ev.num_samples if _trained_here(ev) else None,
    "B": lambda ev: ev.beam_width if _trained_here(ev) else None,
    "decoding": lambda ev: (
        ev.decoding + (f"({ev.results['beam_width']})" if ev.results.get("beam_width") else "")
    ),
    "search": lambda ev: (
        f"{ev.get('search.method')}({ev.get('search.particles')})" if ev.mode == "search" else None
    ),
    "adapter": lambda ev: (
        ("trained" if ev.results.get("adapter") or ev.get("eval.adapter") else "frozen")
        if ev.mode in ("eval", "search")
        else None
    ),
}


def _sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers (also as strings) in numeric order, then text; None first."""
    if value is None:
        return (0, 0.0, "")
    try:
        return (1, float(value), "")
    except (TypeError, ValueError):
        return (2, 0.0, str(value))


def sweep_keys(evals: Sequence[Evaluation]) -> list[str]:
    """The descriptors that vary across a sweep (task and model excepted: they form blocks)."""
    varying = [k for k, get in DESCRIPTORS.items() if len({get(ev) for ev in evals}) > 1]
    return [k for k in varying if k not in ("task", "model")] or ["system"]


def sweep_label(ev: Evaluation, keys: Sequence[str]) -> str:
    """`λ=0.5 B=3`: the evaluation's values of the swept keys (those it has: a search run has
    no λ); its system when it has none of them."""
    values = [(k, DESCRIPTORS[k](ev)) for k in keys]
    return " ".join(f"{k}={v}" for k, v in values if v is not None) or ev.system


def sweep_table(evals: Sequence[Evaluation]) -> Table:
    """Any sweep: one row per evaluation, labelled by the keys that vary across the sweep;
    one block per (task, model); best per block in bold."""
    keys = sweep_keys(evals)
    blocks = []
    for task in tasks_of(evals):
        for model in models_of(evals):
            group = [ev for ev in evals if ev.task == task and ev.model == model]
            group.sort(key=lambda ev: tuple(_sort_key(DESCRIPTORS[k](ev)) for k in keys))
            if group:
                rows = [
                    Row(
                        sweep_label(ev, keys),
                        [score_cell(ev), Cell(text=f"{ev.results['validity']:.3f}")],
                    )
                    for ev in group
                ]
                blocks.append(Block(rows, title=f"{task} / {model} ({group[0].metric})"))
    return Table(
        "sweep",
        "Sweep results: mean ± std over test sets; best per block in bold.",
        ["Configuration", "score", "validity"],
        blocks,
    ).mark_best()
