"""Compare systems across results files, aware of how their test sets were drawn.

    python -m experiments.aggregate compare DIR [DIR ...] --out OUT [--reference LABEL ...]

A *system* is the weights (frozen, an adapter directory, or a training run), the decoding
(greedy, beam(width)) or search method with its particles and potential, and the selection (a
Sample-Rerank run also selects Full IS on its particles). Every results file, and every paired
selection of a search run, measures one system. A *test set* is the set of its example ids
(normalised by `relative_uid`), never its index: under the old drawing (`seed_plus_index`, set i
of seed s drawn with Random(s + i)) seed 0's set 1 and seed 1's set 0 are the same examples and
count once. One system's measurements of one set are pooled as draws: the sampler draws of a
search method, or repeated evaluations of a deterministic decoding (their spread is
bf16/batching noise). The spread between sets (of the draw-averaged scores) and between draws
(within a set) are reported apart. Differences against reference systems use only the sets both
measured, with a paired bootstrap that resamples examples (the same for both systems) and each
system's draws. Per-set scores are recomputed from the predictions' per-example statistics
where the metric is a function of their sum (micro-F1's tp/fp/fn; BLEU's lengths and n-gram
matches, from the outputs' text), and must agree with the results file. Each system's cost,
forward token positions per output (`costs`), sits beside its quality, and per task a frontier
plot (`frontier`) places every system by both. The reading (`results_files`), the systems' keys (`system_keys`), the
pooling (`pool`) and the paired bootstrap (`paired`) are building blocks of their own.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.costs import cost_text, pooled_cost
from experiments.frontier import frontier_plots
from experiments.intervals import COUNTS, RESAMPLES, SEED
from experiments.paired import paired_bootstrap
from experiments.pool import (
    SEED_PLUS_INDEX,
    Pool,
    PooledSystem,
    SetId,
    collect,
    one_metric,
    relabel,
)
from experiments.runs import AggregationError, Evaluation
from experiments.system_keys import SEARCH_NAMES
from experiments.table_format import Block, Cell, Row, Table, to_latex, to_markdown
from grammarrl.runs.results import mean_std

__all__ = ["COUNTS", "SEARCH_NAMES", "collect", "comparison", "comparison_table", "report"]

NAME = "comparison"
COST_COLUMN = "forward tokens / output"
DRAWINGS = {
    SEED_PLUS_INDEX: "seed_plus_index (set i of seed s drawn with Random(s+i): seeds overlap)",
    "disjoint": "disjoint (the sets of different seeds share no example)",
}


def between_draw_std(system: PooledSystem) -> float | None:
    """Root of the mean, over the sets drawn more than once, of the within-set sample variance
    over draws; None when no set was drawn twice."""
    variances = [mean_std(d.scores)[1] ** 2 for d in system.sets.values() if len(d.scores) > 1]
    return math.sqrt(sum(variances) / len(variances)) if variances else None


def _set_order(pool: Pool) -> dict[SetId, str]:
    """Short names S1, S2, ... of the distinct test sets, in order of their first drawing."""
    ordered = sorted(pool.origins, key=lambda s: (sorted(pool.origins[s]), sorted(s)))
    return {uids: f"S{index}" for index, uids in enumerate(ordered, start=1)}


def _paired(
    system: PooledSystem, reference: PooledSystem, names: dict[SetId, str]
) -> dict[str, Any]:
    """The per-set differences (system − reference) on the sets both measured, their mean and
    std, the sets ahead and, where both have counts, the paired bootstrap."""
    shared = sorted(system.sets.keys() & reference.sets.keys(), key=names.__getitem__)
    diffs = {names[s]: system.sets[s].mean - reference.sets[s].mean for s in shared}
    mean, std = mean_std(list(diffs.values())) if diffs else (None, None)
    std = std if len(diffs) > 1 else None
    found: dict[str, Any] = {
        "reference": reference.label,
        "shared_sets": len(shared),
        "per_set": diffs,
        "mean": mean,
        "std": std,
        "sets_ahead": sum(d > 0 for d in diffs.values()),
        "bootstrap": None,
    }
    if shared and all(system.sets[s].counted and reference.sets[s].counted for s in shared):
        pairs = [
            (np.stack(system.sets[s].counts), np.stack(reference.sets[s].counts)) for s in shared
        ]
        found["bootstrap"] = paired_bootstrap(pairs)
    return found


def _summary(system: PooledSystem, names: dict[SetId, str]) -> dict[str, Any]:
    """A system's numbers: sets, examples, draws, mean and the two spreads."""
    means = system.set_means()
    draws = [len(d.scores) for d in system.sets.values()]
    return {
        "label": system.label,
        "key": dict(system.key),
        "pooled_from": system.pooled,
        "deterministic": system.deterministic,
        "drawings": sorted(system.drawings),
        "runs": sorted(system.runs),
        "num_sets": len(means),
        "num_examples": len(set().union(*system.sets)),
        "draws_min": min(draws),
        "draws_max": max(draws),
        "mean": mean_std(means)[0],
        "between_set_std": mean_std(means)[1] if len(means) > 1 else None,
        "between_draw_std": between_draw_std(system),
        "cost": pooled_cost(system.costs.values()),
        "sets": {
            names[s]: {"draws": d.scores, "mean": d.mean, "origins": d.origins}
            for s, d in sorted(system.sets.items(), key=lambda item: names[item[0]])
        },
    }


def _default_reference(system: PooledSystem) -> bool:
    """Frozen greedy, and Sample-Rerank with the frozen proposal."""
    key = dict(system.key)
    if key["weights"] != "frozen":
        return False
    return key["decoding"] == "greedy" or key.get("method") == key.get("selection") == "rerank"


def _references(systems: Sequence[PooledSystem], wanted: Sequence[str]) -> list[PooledSystem]:
    """The systems named by label, else the default references present."""
    if not wanted:
        return [s for s in systems if _default_reference(s)]
    by_label = {s.label: s for s in systems}
    unknown = [label for label in wanted if label not in by_label]
    if unknown:
        raise AggregationError(
            f"no system labelled {', '.join(map(repr, unknown))}; the systems: "
            + ", ".join(map(repr, by_label))
        )
    return [by_label[label] for label in wanted]


def _overlaps(pool: Pool, names: dict[SetId, str]) -> list[dict[str, Any]]:
    """Pairs of distinct test sets that share examples, and how many."""
    ordered = sorted(names, key=names.__getitem__)
    return [
        {"sets": [names[a], names[b]], "shared_examples": len(a & b)}
        for i, a in enumerate(ordered)
        for b in ordered[i + 1 :]
        if a & b
    ]


def system_order(system: PooledSystem) -> tuple[bool, bool, str]:
    """Frozen weights first, deterministic decoding before search, then by label."""
    return dict(system.key)["weights"] != "frozen", not system.deterministic, system.label


def comparison(
    evals: Sequence[Evaluation], references: Sequence[str] = (), labels: Sequence[str] = ()
) -> dict[str, Any]:
    """Every number of the comparison, as plain data (comparison.json)."""
    metric = one_metric(evals)
    pool = collect(evals)
    names = _set_order(pool)
    systems = sorted(relabel(list(pool.systems.values()), labels), key=system_order)
    refs = _references(systems, references)
    summaries = []
    for system in systems:
        summary = _summary(system, names)
        summary["versus"] = [_paired(system, ref, names) for ref in refs if ref is not system]
        summaries.append(summary)
    return {
        "metric": metric,
        "num_sets": len(names),
        "num_examples": len(set().union(*names)),
        "drawings": sorted({d for s in systems for d in s.drawings}),
        "resamples": RESAMPLES,
        "seed": SEED,
        "references": [ref.label for ref in refs],
        "sets": {
            name: {"size": len(uids), "origins": sorted(pool.origins[uids]), "uids": sorted(uids)}
            for uids, name in sorted(names.items(), key=lambda item: item[1])
        },
        "overlaps": _overlaps(pool, names),
        "systems": summaries,
    }


def _number(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.3f}" if sign else f"{value:.3f}"


def _versus_cells(system: dict[str, Any], reference: str) -> list[Cell]:
    """The difference and bootstrap cells of one system against one reference."""
    found = next((v for v in system["versus"] if v["reference"] == reference), None)
    if found is None:
        return [Cell(text="–"), Cell(text="–")]
    if not found["shared_sets"]:
        return [Cell(text="no shared set"), Cell(text="–")]
    spread = "" if found["std"] is None else f" ± {_number(found['std'])}"
    diff = (
        f"{_number(found['mean'], sign=True)}{spread} "
        f"({found['sets_ahead']}/{found['shared_sets']})"
    )
    boot = found["bootstrap"]
    if boot is None:
        return [Cell(text=diff), Cell(text="–")]
    both = boot["examples_and_draws"]
    interval = (
        f"[{_number(both['low'], True)}, {_number(both['high'], True)}] "
        f"P(>0)={both['p_above_zero']:.3f}"
    )
    return [Cell(text=diff), Cell(text=interval)]


def _row(system: dict[str, Any], references: Sequence[str]) -> Row:
    draws = f"{system['draws_min']}" + (
        f"–{system['draws_max']}" if system["draws_max"] != system["draws_min"] else ""
    )
    cells = [
        Cell(system["mean"]),
        Cell(text=_number(system["between_set_std"])),
        Cell(text=_number(system["between_draw_std"])),
        Cell(text=f"{system['num_sets']} × {draws}"),
        Cell(text=", ".join(system["drawings"])),
        Cell(text=cost_text(system["cost"])),
    ]
    for reference in references:
        cells += _versus_cells(system, reference)
    return Row(system["label"], cells)


def _caption(data: dict[str, Any]) -> str:
    drawings = "; ".join(DRAWINGS.get(d, d) for d in data["drawings"])
    overlaps = ", ".join(
        f"{'/'.join(o['sets'])} share {o['shared_examples']}" for o in data["overlaps"]
    )
    return (
        f"{data['metric']} on {data['num_sets']} distinct test sets ({data['num_examples']} "
        f"distinct examples), drawing: {drawings}. A set is its examples, never its index. "
        "Mean: over a system's sets of the set's score averaged over its draws; the between-set "
        "std (ddof=1, of those per-set scores) and the between-draw std (root mean within-set "
        "variance over draws, sets drawn more than once) are separate columns. diff: paired "
        "per-set difference (row - reference) on the sets both measured, mean ± std (sets "
        f"ahead/shared sets); bootstrap: 95% interval and P(>0) over {data['resamples']:,} "
        f"resamples (seed {data['seed']}) of each shared set's examples (the same for both) and of "
        f"each system's draws. {COST_COLUMN}: model forward token positions per distinct "
        "output (one draw of a search), generation plus a search's potential; n/a where a "
        "results file records none."
        + (f" Partially overlapping sets: {overlaps}." if overlaps else "")
    )


def _notes(data: dict[str, Any]) -> list[str]:
    """The sets' origins, each system's pooled runs, and what the empty cells mean."""
    notes = [
        "Test sets: "
        + "; ".join(
            f"{name} ({s['size']}): {', '.join(s['origins'])}" for name, s in data["sets"].items()
        )
        + ".",
        "",
        (
            "Deterministic systems (greedy, beam) evaluated more than once on a set count the "
            "evaluations as draws: their spread is bf16/batching noise, not sampling."
        ),
    ]
    if any(
        v["bootstrap"] is None and v["shared_sets"] for s in data["systems"] for v in s["versus"]
    ):
        notes += [
            "",
            (
                "Bootstrap cells are empty where the predictions hold no per-example "
                "statistics (tp/fp/fn, or the outputs' text for BLEU)."
            ),
        ]
    for system in data["systems"]:
        pooled = system["pooled_from"]
        by_label = f" (--label pooled {'; '.join(pooled)})" if len(pooled) > 1 else ""
        notes += ["", f"- {system['label']}{by_label}: " + ", ".join(system["runs"])]
    return notes


def comparison_table(data: dict[str, Any]) -> Table:
    """comparison.md / .tex: one row per system, the differences against each reference."""
    header = ["system", f"{data['metric']} mean", "between-set std", "between-draw std"]
    header += ["sets × draws", "drawing", COST_COLUMN]
    for reference in data["references"]:
        header += [f"diff vs {reference}", f"bootstrap 95% vs {reference}"]
    rows = [_row(system, data["references"]) for system in data["systems"]]
    return Table(
        NAME, _caption(data), header, [Block(rows)], best="max", notes=_notes(data)
    ).mark_best()


def report(evals: list[Evaluation], out: Path, args: argparse.Namespace) -> list[Path]:
    """`<out>/comparison.md`, `.tex` and `.json`, and per task `frontier_<task>.png`."""
    data = comparison(
        evals, getattr(args, "reference", None) or (), getattr(args, "label", None) or ()
    )
    table = comparison_table(data)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{NAME}.md", out / f"{NAME}.tex", out / f"{NAME}.json"]
    paths[0].write_text(to_markdown(table), encoding="utf-8")
    paths[1].write_text(to_latex(table), encoding="utf-8")
    paths[2].write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return paths + frontier_plots(data, out)
