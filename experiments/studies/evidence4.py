"""Evidence IV's dev pilot (issue 56): each route of `conf/experiment/evidence4_pilot_cpu.yaml`
against Evidence II's λ=0.75 RLOO run on the same 200 dev inputs, and the pilot's rule for
going to test.

Per route and validation step (the rows of `evidence3_lambda`): dev micro-F1 with its paired
differences (95% bootstrap over the shared inputs) from step 0 (the frozen model), from the
λ=0.75 run at the same step (the same step is the same compute: no route adds a forward pass
to RLOO's) and from that run's 360-step adapter (chosen on 48 of these inputs, which favours
it); per-field precision/recall, filled fields per output and the empty-field rate (the share
of gold-filled fields an output leaves empty; frozen ≈60%). A route goes to test when one of
its validations beats the 360-step adapter, or the λ=0.75 run at the same step, with the whole
interval above 0.

    python -m experiments.studies.evidence4 multirun/evidence4/pilot \
        --out experiments/results/evidence4/pilot
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.curves import training_curves
from experiments.dev_selection import paired_dev_interval
from experiments.runs import AggregationError
from experiments.studies.evidence3 import dev_golds, interval_cell, records_by_step
from experiments.studies.evidence3_ablation import dev_table, field_table
from experiments.studies.evidence3_lambda import (
    PANELS,
    REFERENCE,
    REFERENCE_OUTPUTS,
    REFERENCE_RUN,
    comparison_rows,
    figure_series,
)
from grammarrl.tasks.conll import empty_field_rate

ADAPTER_360 = 360  # the λ=0.75 run's step whose adapter is the bar (0.346 on these inputs)
EMPTY = "empty-field %"  # the row's key is its column (evidence3_ablation.dev_table)
EXTRA = (("val/dev_empty_field_rate", EMPTY),)


def route_dirs(sweep: Path) -> dict[str, Path]:
    """route name -> its job folder (`<num>_<route>`, the pilot's subdir), in job order."""
    jobs = sorted(
        (p for p in sweep.iterdir() if p.is_dir() and "_" in p.name),
        key=lambda p: int(p.name.split("_", 1)[0]),
    )
    if not jobs:
        raise AggregationError(f"{sweep}: no job folders <num>_<route>")
    return {p.name.split("_", 1)[1]: p for p in jobs}


def _empty_rate(folder: Path, step: int, golds: Mapping[str, str]) -> float:
    records = records_by_step(folder)[step]
    return empty_field_rate([r["prediction"] for r in records], [golds[r["uid"]] for r in records])


def pilot_rows(
    routes: Mapping[str, Path],
    golds: Mapping[str, str],
    reference: Mapping[int, Path] = REFERENCE_OUTPUTS,
) -> list[dict[str, Any]]:
    """The reference's rows once, then each route's validations with `vs_adapter_360` and every
    row's empty-field rate."""
    if ADAPTER_360 not in reference:
        raise AggregationError(f"the reference outputs need step {ADAPTER_360} (its adapter)")
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, int]] = set()
    for label, run in routes.items():
        for row in comparison_rows(run, label, golds, reference):
            if (row["run"], row["step"]) in seen:  # the reference's rows come with every route
                continue
            seen.add((row["run"], row["step"]))
            if row["run"] == label:
                folder, at = run, row["step"]
                row["vs_adapter_360"] = paired_dev_interval(run, reference[ADAPTER_360], at, 0)
            else:  # a reference row: its folder's step-0 record
                folder, at = reference[row["step"]], 0
            row[EMPTY] = _empty_rate(folder, at, golds)
            rows.append(row)
    return rows


def goes_to_test(rows: Sequence[Mapping[str, Any]], label: str) -> bool:
    """The pilot's rule: a validation of the route beats the 360-step adapter or the λ=0.75 run
    at its step, the interval's lower end above 0."""
    return any(
        row[key] is not None and row[key][1] > 0
        for row in rows
        if row["run"] == label
        for key in ("vs_adapter_360", "vs_reference")
    )


def markdown(rows: Sequence[Mapping[str, Any]], routes: Sequence[str]) -> str:
    """The dev table (with Δ vs the 360-step adapter), per-field P/R, and the rule per route."""
    adapter = [
        f"| {r['run']} | {r['step']} | {interval_cell(r['vs_adapter_360'])} |"
        for r in rows
        if "vs_adapter_360" in r
    ]
    verdicts = [
        f"- {label}: {'to test' if goes_to_test(rows, label) else 'stays on dev'}"
        for label in routes
    ]
    return (
        dev_table(rows, "run", REFERENCE, extra=EXTRA)
        + f"\nAgainst the {REFERENCE} run's {ADAPTER_360}-step adapter on the same inputs:\n\n"
        + "| run | step | Δ vs adapter-360 [95%] |\n|---|---|---|\n"
        + "\n".join(adapter)
        + "\n\n"
        + field_table(rows, "run")
        + "\nThe pilot's rule (an interval above 0 against either bar):\n\n"
        + "\n".join(verdicts)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the pilot's sweep dir (<num>_<route> jobs)")
    parser.add_argument("--out", type=Path, required=True, help="folder for pilot.md/json/png")
    args = parser.parse_args(argv)
    routes = route_dirs(args.sweep)
    rows = pilot_rows(routes, dev_golds(next(iter(routes.values()))))
    text = markdown(rows, list(routes))
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"rows": rows, "to_test": {label: goes_to_test(rows, label) for label in routes}}
    (args.out / "pilot.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (args.out / "pilot.md").write_text(text, encoding="utf-8")
    logs = {REFERENCE: REFERENCE_RUN, **routes}
    training_curves(figure_series(rows, logs), "micro_f1", args.out / "pilot.png", PANELS)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
