"""Evidence III (issue 45): RLOO at another λ against Evidence II's λ=0.75 run, step by step.

The run (`conf/experiment/evidence3_lambda_cpu.yaml`: Evidence II's setting at the diagnosis's
λ=0.25) validates on the same 200 dev inputs as Evidence III's span attribution, where the
λ=0.75 run's greedy outputs are committed at steps 0 (the frozen model), 120 and 360 (its
adapters). Per validation step of the run: dev micro-F1, its paired difference from step 0 and
from the λ=0.75 run at the same step where that step was decoded (95% bootstrap intervals over
the shared inputs), precision and recall per field and over all fields, entities per output;
the λ=0.75 run's rows beside them. Then both runs' training logs by stretches of steps (KL,
rewards, grammar mass, rollout length) and one figure: dev F1 and entities on the shared inputs,
and the training curves.

    python -m experiments.studies.evidence3_lambda multirun/evidence3/lambda0.25 \
        --out experiments/results/evidence3-lambda
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.curves import Series, training_curves
from experiments.dev_selection import paired_dev_interval
from experiments.runs import AggregationError
from experiments.studies.evidence3 import dev_golds, dev_summary, records_by_step
from experiments.studies.evidence3_ablation import (
    dev_table,
    field_table,
    stretch_rows,
    stretch_table,
)
from grammarrl.evaluation.curves import read_metrics

RESULTS = Path("experiments/results")
# The λ=0.75 run's greedy outputs on the shared dev inputs: step -> a folder whose dev record at
# step 0 holds them (the ablation's frozen validation; the committed adapters' validations).
REFERENCE_OUTPUTS = {
    0: RESULTS / "evidence3-ablation/runs/0_kl_reward",
    120: RESULTS / "evidence3-spans/adapter120-dev",
    360: RESULTS / "evidence3-pilot",
}
REFERENCE_RUN = (  # its training log (metrics.csv)
    RESULTS / "smollm2-cpu-2/runs-bf16-s4/train/0_lambda=0.75,rollout.num_samples=3,"
    "trainer.max_steps=400"
)
REFERENCE = "λ=0.75"
PANELS = (  # (key, smoothed): the first two from the shared dev inputs, the rest as logged
    ("dev/micro_f1", False),
    ("dev/entities_per_output", False),
    ("train/reward_direct", True),
    ("train/reward_reverse", True),
    ("train/kl", True),
    ("train/candidate_tokens", True),
    ("train/log_valid_mass", True),
)


def comparison_rows(
    run: Path,
    label: str,
    golds: Mapping[str, str],
    reference: Mapping[int, Path] = REFERENCE_OUTPUTS,
) -> list[dict[str, Any]]:
    """The reference's rows (step 0 first), then one row per later validation of `run` with
    its paired differences from step 0 and from the reference at the same step (None where the
    reference has no outputs at that step)."""
    if 0 not in reference:
        raise AggregationError("the reference outputs need step 0 (the frozen model)")
    rows = []
    for step, folder in sorted(reference.items()):
        records = records_by_step(folder).get(0)
        if not records:
            raise AggregationError(f"{folder}: no dev record at step 0 (validation.jsonl)")
        rows.append({"run": REFERENCE if step else "step 0", "step": step})
        rows[-1].update(dev_summary(records, golds))
    for step, records in sorted(records_by_step(run).items()):
        if step == 0:
            continue
        row = {"run": label, "step": step, **dev_summary(records, golds)}
        row["vs_step_0"] = paired_dev_interval(run, reference[0], step, 0)
        same = reference.get(step)
        row["vs_reference"] = paired_dev_interval(run, same, step, 0) if same else None
        rows.append(row)
    return sorted(rows, key=lambda r: (r["step"], r["run"] != REFERENCE))


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Two tables: dev results by run and step; per-field P/R."""
    return dev_table(rows, "run", REFERENCE, extra=()) + "\n" + field_table(rows, "run")


def figure_series(rows: Sequence[Mapping[str, Any]], logs: Mapping[str, Path]) -> dict[str, Series]:
    """label -> its training log plus `dev/` curves from the rows (step 0 shared by all)."""
    series = {}
    for label, run in logs.items():
        own = [r for r in rows if r["run"] in (label, "step 0")]
        series[label] = {
            **read_metrics(run),
            "dev/micro_f1": [(r["step"], r["dev_micro_f1"]) for r in own],
            "dev/entities_per_output": [(r["step"], r["entities_per_output"]) for r in own],
        }
    return series


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run's directory")
    parser.add_argument("--out", type=Path, required=True, help="folder for lambda.md/json/png")
    parser.add_argument("--label", default="λ=0.25", help="the run's name in the tables")
    parser.add_argument("--every", type=int, default=40, help="the training stretch, in steps")
    args = parser.parse_args(argv)
    rows = comparison_rows(args.run, args.label, dev_golds(args.run))
    logs = {REFERENCE: REFERENCE_RUN, args.label: args.run}
    stretches = {label: stretch_rows(run, args.every) for label, run in logs.items()}
    text = markdown(rows) + "".join(
        f"\nTraining of {label}, by stretches of {args.every} steps:\n\n" + stretch_table(s)
        for label, s in stretches.items()
    )
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"rows": rows, "stretches": stretches}
    (args.out / "lambda.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (args.out / "lambda.md").write_text(text, encoding="utf-8")
    training_curves(figure_series(rows, logs), "micro_f1", args.out / "lambda.png", PANELS)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
