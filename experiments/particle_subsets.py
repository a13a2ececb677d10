"""Search quality against particle count, read from recorded particles: no decoding.

An IS run (Full IS and Sample-Rerank on its particles) never resamples, so an example's K
particles are independent draws from the proposal and its first m are an IS(m) draw. For m = 1..K
this picks each method's output (`grammarrl.search.registry`: Full IS's posterior mode,
Sample-Rerank's best potential) among every example's first m particles, scores the picks per
test set with the run's task metric, and averages over sets and over the runs given (sampler
draws). Where the k = 3 and k = 10 runs of a study differ, the curve says at which m a method
starts to pay on the same particles.

    R=experiments/results/frontier
    python -m experiments.particle_subsets $R/runs/conll/is10_s{0,1,2} \
        --reference "frozen greedy=$R/runs/conll/frozen_greedy" \
        --reference "GrammarRL greedy=$R/runs/conll/trained_greedy" \
        --out $R/report/conll/particle_subsets.json --plot $R/report/conll/particle_subsets.png

`--reference LABEL=RUN` adds a run's recorded mean (a greedy system on the same test sets) as a
flat line to the plot and a field to the JSON; RUN is a run folder, or one results file in it
where the folder holds two (a training run's `results.json` and `results_best_dev.json`).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import matplotlib.pyplot as plt
from omegaconf import OmegaConf

from experiments.results_files import one_evaluation, read_rows
from experiments.runs import AggregationError
from grammarrl.decoding.smc import ParticleSet
from grammarrl.decoding.types import Generation
from grammarrl.errors import GrammarRLError
from grammarrl.evaluation.plots import save_figure
from grammarrl.runs.rundir import read_record
from grammarrl.search.methods import NEG_INF
from grammarrl.search.registry import search_method
from grammarrl.tasks import Task, load_task
from grammarrl.types import Example

METHODS = {"is": "Full IS", "rerank": "Sample-Rerank"}


def particle_set(particles: list[dict[str, Any]]) -> ParticleSet:
    """A predictions row's recorded particles as the `ParticleSet` the selections read: text,
    whether it finished, log weight, potential and log p(y | x) (the fields they use)."""
    generations = [
        Generation(
            token_ids=[],
            text=p["text"],
            logp_unconstrained=[p["logp_unconstrained"]],
            logp_constrained=[],
            log_allowed_mass=[],
            finished=p["finished"],
            truncated=not p["finished"],
            kind="sample",
        )
        for p in particles
    ]
    weights = [NEG_INF if p["log_weight"] is None else p["log_weight"] for p in particles]
    potentials = [NEG_INF if p["potential"] is None else p["potential"] for p in particles]
    return ParticleSet(generations, weights, potentials)


def pick(particles: list[dict[str, Any]], method: str, m: int) -> str:
    """The output `method` selects among the first `m` recorded particles."""
    subset = particle_set(particles[:m])
    return subset.generations[search_method(method).select(subset)].text


def curve(rows: list[dict[str, Any]], task: Task, methods: Sequence[str]) -> dict[str, list]:
    """Per method, the metric at m = 1..K: each (sampler draw, set)'s score of the picks among
    the first m particles, averaged over the draws of a set, then over the sets."""
    if not rows or any("particles" not in r for r in rows):
        raise AggregationError("no search particles: give the folders of IS (or rerank) runs")
    sizes = {len(r["particles"]) for r in rows}
    if len(sizes) != 1:
        raise AggregationError(f"rows hold different particle counts: {sorted(sizes)}")
    if any(r.get("resamples") for r in rows):
        raise AggregationError("a row was resampled: its particles are not independent draws")
    (count,) = sizes
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["sampler_seed"], r["set"])].append(r)
    examples = {
        key: [Example(r["uid"], r["input"], r["gold"]) for r in group]
        for key, group in groups.items()
    }
    out: dict[str, list] = {}
    for method in methods:
        out[method] = []
        for m in range(1, count + 1):
            by_set: dict[int, list[float]] = defaultdict(list)
            for key, group in sorted(groups.items()):
                texts = [pick(r["particles"], method, m) for r in group]
                by_set[key[1]].append(task.score(texts, examples[key]).value)
            out[method].append(fmean(fmean(v) for v in by_set.values()))
    return out


def first_reaching(points: Sequence[float], level: float) -> int | None:
    """The smallest m (1-based) whose point is at or above `level`; None if none is."""
    return next((m for m, value in enumerate(points, start=1) if value >= level), None)


def particle_curves(runs: Sequence[Path], references: Mapping[str, Path]) -> dict[str, Any]:
    """The curves of one task's IS runs (sampler draws on one test draw), with each reference's
    recorded mean (a run folder, or a results file in it) and the first m at which each method
    reaches it. Scoring loads the run's task, so its data must be set up as for the runs."""
    record = read_record(runs[0])
    if record is None:
        raise AggregationError(f"{runs[0]}: no job.json or results.json to read the task from")
    task = load_task(OmegaConf.create(record["config"]))
    rows = [row for run in runs for row in read_rows(one_evaluation(run))]
    curves = {METHODS[m]: points for m, points in curve(rows, task, list(METHODS)).items()}
    result = {
        "runs": [str(run) for run in runs],
        "task": task.name,
        "metric": task.metric_name,
        "examples": len({(r["set"], r["uid"]) for r in rows}),
        "draws": len({r["sampler_seed"] for r in rows}),
        "particles": list(range(1, len(rows[0]["particles"]) + 1)),
        "curves": curves,
        "references": {},
    }
    for label, run in references.items():
        mean = one_evaluation(run).results["mean"]
        result["references"][label] = {
            "run": str(run),
            "mean": mean,
            "first_m_reaching": {name: first_reaching(p, mean) for name, p in curves.items()},
        }
    return result


def curves_markdown(results: Mapping[str, dict[str, Any]]) -> str:
    """One row per task (a name: its `particle_curves`): one sample (m = 1), each reference with
    the first m at which Full IS and Sample-Rerank reach it ("never" within K), and Full IS at
    m = 3 and at K."""
    labels = list(dict.fromkeys(label for r in results.values() for label in r["references"]))
    head = ["task (examples × draws)", "one sample (m = 1)"]
    for label in labels:
        head += [label, *(f"{name} reaches it at m" for name in METHODS.values())]
    head.append("Full IS at m = 3 / K")
    lines = ["| " + " | ".join(head) + " |", "|---|" + ":-:|" * (len(head) - 1)]
    for name, r in results.items():
        full = r["curves"]["Full IS"]
        cells = [f"{name} ({r['examples']} × {r['draws']})", f"{full[0]:.3f}"]
        for label in labels:
            ref = r["references"].get(label)
            reached = ref["first_m_reaching"] if ref else {}
            cells.append(f"{ref['mean']:.3f}" if ref else "not run")
            cells += [str(reached[m] or "never") if ref else "" for m in METHODS.values()]
        cells.append(f"{full[2]:.3f} / {full[-1]:.3f} (K = {len(full)})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", type=Path, help="IS run folders of one task and test draw"
    )
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="LABEL=RUN",
        help="a run folder (or one results file in it) on the same test sets whose mean is drawn"
        " as a flat line (repeatable)",
    )
    parser.add_argument("--out", type=Path, help="write the curve here as JSON (else stdout)")
    parser.add_argument("--plot", type=Path, help="draw the curve here (PNG)")
    args = parser.parse_args(argv)
    try:
        result = particle_curves(args.runs, dict(read_reference(t) for t in args.reference))
    except (AggregationError, GrammarRLError) as err:
        raise SystemExit(f"error: {err}") from None
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    if args.plot:
        plot(result, args.plot)
    print(text)


def plot(result: dict[str, Any], path: Path) -> Path:
    """Each method's metric against m (solid, markers) and each reference (dashed, flat)."""
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    m = result["particles"]
    for label, points in result["curves"].items():
        ax.plot(m, points, "-o", markersize=3, label=f"{label} (first m of {m[-1]})")
    for index, (label, ref) in enumerate(result["references"].items()):
        ax.axhline(ref["mean"], linestyle="--", color=f"C{index + 2}", label=label)
    ax.set(
        title=f"{result['task']}: {result['examples']} examples × {result['draws']} draws",
        xlabel="particles m",
        ylabel=result["metric"],
        xticks=m,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def read_reference(text: str) -> tuple[str, Path]:
    """`LABEL=RUN` as (label, run folder or results file)."""
    label, sep, run = text.partition("=")
    if not sep:
        raise SystemExit(f"--reference {text}: expected LABEL=RUN")
    return label, Path(run)


if __name__ == "__main__":
    main()
