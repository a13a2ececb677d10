"""Evidence III, part 1 (issue 45): which term of RLOO's objective pays for the extra spans?

The ablation sweep (`conf/experiment/evidence3_ablation_cpu.yaml`) trains one variant of
Evidence II's setting per job from the frozen model and validates each on the same dev inputs
at the same steps; only the reference variant (`kl_reward`, Evidence II's own) validates at
step 0, which is every variant's step 0 (the frozen model, the same inputs in the same batches).
(A continuation sweep, `evidence3_continue_cpu.yaml`, starts every variant from one adapter
and takes step 0 from another run's record: `--step-0`.) Per variant and validation step: dev micro-F1, its paired difference from step 0 and from the
reference at the same step (95% bootstrap intervals over the shared dev inputs), precision and
recall per field and over all fields, entities per output (gold's too), the frozen model's
rewards of the greedy outputs; per stretch of training before it, the means of the logged
KL terms, rewards, grammar mass, rollout length and step time. One figure of the curves.

    python -m experiments.studies.evidence3_ablation multirun/evidence3/ablation \
        --out experiments/results/evidence3-ablation
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.curves import PANELS, Series, curve, training_curves
from experiments.dev_selection import dev_records, paired_dev_interval
from experiments.runs import AggregationError
from experiments.studies.evidence3 import (
    dev_golds,
    dev_summary,
    entities_per_output,
    interval_cell,
    records_by_step,
    window_mean,
)
from grammarrl.evaluation.curves import read_metrics
from grammarrl.tasks.conll import FIELDS

REFERENCE = "kl_reward"  # Evidence II's setting; the sweep's only job validating at step 0
JOB = re.compile(r"^(\d+)_(.+)$")  # the sweep's subdir: <job number>_<variant>
VALIDATION = (  # (logged key at a validation, column)
    ("val/dev_reward_direct", "dev R_direct"),
    ("val/dev_reward_reverse", "dev R_reverse"),
)
TRAINING = (  # (logged key, column): means over the steps since the previous validation
    ("train/kl", "KL"),
    ("train/kl_grammar", "KL (grammar)"),
    ("train/reward_direct", "R_direct"),
    ("train/reward_reverse", "R_reverse"),
    ("train/log_valid_mass", "log mass on grammar"),
    ("train/candidate_tokens", "rollout tokens"),
    ("perf/step_seconds", "s / step"),
)
EXTRA_PANELS = (("train/reward_direct", True), ("train/reward_reverse", True))


def variant_runs(sweep: Path) -> dict[str, Path]:
    """variant -> run directory, in job order, for the sweep's jobs that kept dev records; an
    error when the reference variant is missing (it holds step 0)."""
    jobs = sorted(
        (int(m.group(1)), m.group(2), path)
        for path in sweep.iterdir()
        if path.is_dir() and (m := JOB.match(path.name)) and dev_records(path)
    )
    runs = {variant: path for _, variant, path in jobs}
    if REFERENCE not in runs:
        raise AggregationError(f"{sweep}: no `{REFERENCE}` job with dev records (step 0)")
    return runs


def _row(
    variant: str, step: int, records: list[dict[str, Any]], golds: Mapping[str, str]
) -> dict[str, Any]:
    return {"variant": variant, "step": step, **dev_summary(records, golds)}


def ablation_rows(
    runs: Mapping[str, Path], golds: Mapping[str, str], start: Path | None = None
) -> list[dict[str, Any]]:
    """Step 0, then one row per variant and later validation step (module docstring); a step
    the reference has not reached gets no difference from it. `start`: the run directory (or
    results folder) whose dev record holds step 0, by default the reference's."""
    reference = runs[REFERENCE]
    start = start or reference
    ref_steps = records_by_step(reference)
    start_records = records_by_step(start).get(0)
    if not start_records:
        raise AggregationError(f"{start}: no dev record at step 0 (validation.jsonl)")
    rows = [_row("step 0", 0, start_records, golds)]
    rows[0]["gold_entities_per_output"] = entities_per_output(
        [{"gold": golds[r["uid"]]} for r in start_records], key="gold"
    )
    for variant, run in runs.items():
        series = read_metrics(run)
        steps = sorted(s for s in records_by_step(run).items() if s[0] > 0)
        previous = 0
        for step, records in steps:
            row = _row(variant, step, records, golds)
            row["vs_step_0"] = paired_dev_interval(run, start, step, 0)
            same = variant != REFERENCE and step in ref_steps
            row["vs_reference"] = paired_dev_interval(run, reference, step, step) if same else None
            for key, column in VALIDATION:
                row[column] = dict(curve(series, key)).get(step)
            for key, column in TRAINING:
                row[column] = window_mean(series, key, previous, step)
            rows.append(row)
            previous = step
    for key, column in VALIDATION:  # step 0's, as its run logged it
        rows[0][column] = dict(curve(read_metrics(start), key)).get(0)
    return rows


def stretch_rows(run: Path, every: int) -> list[dict[str, Any]]:
    """The training columns of a (long) run over stretches of `every` steps, with the mean log
    mass on the grammar per rollout token; None where a stretch logged nothing of a key."""
    series = read_metrics(run)
    last = max((step for step, _ in curve(series, "train/kl")), default=-1)
    rows = []
    for start in range(0, last + 1, every):
        row: dict[str, Any] = {"variant": run.name, "step": f"{start}–{start + every - 1}"}
        for key, column in TRAINING:
            row[column] = window_mean(series, key, start, start + every)
        mass, tokens = row["log mass on grammar"], row["rollout tokens"]
        row["log mass / token"] = mass / tokens if mass is not None and tokens else None
        rows.append(row)
    return rows


def stretch_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`stretch_rows` as a table."""
    columns = [*(c for _, c in TRAINING), "log mass / token"]
    lines = [[str(r["step"]), *(number_cell(r.get(c)) for c in columns)] for r in rows]
    return markdown_table(["steps", *columns], lines)


def number_cell(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_table(head: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out) + "\n"


def dev_table(
    rows: Sequence[Mapping[str, Any]],
    name: str = "variant",
    reference: str = REFERENCE,
    extra: Sequence[tuple[str, str]] = VALIDATION,
) -> str:
    """Dev results by row (its `name` and step): micro-F1, the paired differences from step 0
    and from `reference`, micro P/R, entities per output, then the `extra` columns."""
    head = [name, "step", "dev micro-F1", "Δ vs step 0 [95%]", f"Δ vs {reference} [95%]"]
    head += ["micro P/R", "entities / output", *(c for _, c in extra)]
    lines = [
        [
            row[name],
            str(row["step"]),
            f"{row['dev_micro_f1']:.3f}",
            interval_cell(row.get("vs_step_0")),
            interval_cell(row.get("vs_reference")),
            f"{row['fields']['micro']['precision']:.2f}/{row['fields']['micro']['recall']:.2f}",
            f"{row['entities_per_output']:.2f}",
            *(number_cell(row.get(c), 3) for _, c in extra),
        ]
        for row in rows
    ]
    return markdown_table(head, lines)


def field_table(rows: Sequence[Mapping[str, Any]], name: str = "variant") -> str:
    """Precision/recall per field by row (its `name` and step)."""
    lines = [
        [row[name], str(row["step"])]
        + [f"{row['fields'][f]['precision']:.2f}/{row['fields'][f]['recall']:.2f}" for f in FIELDS]
        for row in rows
    ]
    return markdown_table([name, "step", *(f"{f} P/R" for f in FIELDS)], lines)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Three tables: dev results by variant and step; per-field P/R; the training stretches."""
    training = [
        [row["variant"], f"{row['step']}"] + [number_cell(row.get(c)) for _, c in TRAINING]
        for row in rows[1:]
    ]
    gold = rows[0].get("gold_entities_per_output")
    return (
        dev_table(rows)
        + f"\nGold: {number_cell(gold)} entities per output on these dev inputs.\n\n"
        + field_table(rows)
        + "\nTraining stretches (means over the steps before each validation):\n\n"
        + markdown_table(["variant", "up to step", *(c for _, c in TRAINING)], training)
    )


def curve_series(runs: Mapping[str, Path], start: Path | None = None) -> dict[str, Series]:
    """variant -> its logged series, each variant's validation curves starting from step 0 as
    `start` (default: the reference) logged it."""
    start = start or runs[REFERENCE]
    first = read_metrics(start)
    series: dict[str, Series] = {}
    for variant, run in runs.items():
        own = dict(read_metrics(run))
        for key, points in first.items():
            if key.startswith("val/") and run != start:
                own[key] = [p for p in points if p[0] == 0] + list(own.get(key, []))
        series[variant] = own
    return series


def curves_figure(runs: Mapping[str, Path], path: Path, start: Path | None = None) -> Path | None:
    """The sweep's training curves, one line per variant (`curve_series`)."""
    series = curve_series(runs, start)
    return training_curves(series, "micro_f1", path, panels=PANELS + EXTRA_PANELS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the ablation sweep's directory")
    parser.add_argument("--out", type=Path, required=True, help="folder for ablation.md/json/png")
    parser.add_argument("--step-0", type=Path, help="where step 0 is (default: the reference)")
    parser.add_argument("--long-run", type=Path, help="a long run to read in stretches too")
    parser.add_argument("--every", type=int, default=40, help="the long run's stretch, in steps")
    args = parser.parse_args(argv)
    runs = variant_runs(args.sweep)
    rows = ablation_rows(runs, dev_golds(runs[REFERENCE]), args.step_0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ablation.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    text = markdown(rows)
    if args.long_run:
        long = stretch_rows(args.long_run, args.every)
        (args.out / "long_run.json").write_text(json.dumps(long, indent=1) + "\n", "utf-8")
        text += f"\nThe long run `{args.long_run.name}`, by stretches:\n\n" + stretch_table(long)
    (args.out / "ablation.md").write_text(text, encoding="utf-8")
    curves_figure(runs, args.out / "ablation.png", args.step_0)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
