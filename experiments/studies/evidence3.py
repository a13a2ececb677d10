"""Evidence III's dev pilot (issue 45): a training run read against its own step 0.

The pilot (`conf/experiment/evidence3_pilot_cpu.yaml`) starts from the 360-step RLOO adapter and
validates it before its first step, so step 0 of its dev record is the reference of the
continue-or-stop rule: continue only if a later step's greedy beats step 0 on dev by more than
the paired interval. Per validation step: dev micro-F1, its paired difference from step 0 with
a 95% bootstrap interval over the shared dev inputs, per-field precision and recall, entities
per output; per stretch of training before it: the mean ESS of the importance weights, the
share of prompts without targets, the model forward calls and the seconds a step.

    python -m experiments.studies.evidence3 RUN_DIR --out experiments/results/evidence3-pilot
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.curves import Series, curve
from experiments.dev_selection import dev_records, paired_dev_interval
from experiments.intervals import counts_of, micro_f1
from experiments.outputs import field_statistics
from experiments.runs import AggregationError
from grammarrl.evaluation.curves import read_metrics
from grammarrl.tasks.conll import FIELDS, output_fields
from grammarrl.types import Example

if TYPE_CHECKING:
    from omegaconf import DictConfig

TRAINING = (  # (logged key, column): means over the steps since the previous validation
    ("train/ess", "ESS"),
    ("train/no_targets", "no targets"),
    ("perf/step_seconds", "s / step"),
)


def run_config(run: Path) -> DictConfig:
    """The job config a run (or a committed copy of its files) was composed from, by its
    overrides (`.hydra/overrides.yaml`, else `overrides.yaml`)."""
    from omegaconf import OmegaConf

    from grammarrl.job import compose_job_config

    path = run / ".hydra" / "overrides.yaml"
    overrides = OmegaConf.to_container(
        OmegaConf.load(path if path.is_file() else run / "overrides.yaml")
    )
    return compose_job_config([str(o) for o in overrides])


def dev_examples(run: Path) -> dict[str, Example]:
    """uid -> the run's dev inputs (its dev split, then the dev reserve), from its task."""
    from grammarrl.tasks import load_task

    splits = load_task(run_config(run)).splits()
    return {ex.uid: ex for ex in splits.dev + splits.dev_reserve}


def dev_golds(run: Path) -> dict[str, str]:
    """uid -> gold output of the run's dev inputs, from its task composed as the run was."""
    return {uid: ex.target for uid, ex in dev_examples(run).items()}


def window_mean(series: Series, key: str, after: int, upto: int) -> float | None:
    """The mean of a logged metric over the steps in [after, upto); None when none was logged."""
    values = [v for step, v in curve(series, key) if after <= step < upto]
    return sum(values) / len(values) if values else None


def records_by_step(run: Path) -> dict[int, list[dict[str, Any]]]:
    """The run's dev records grouped by validation step, in the order it validated."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in dev_records(run):
        by_step.setdefault(record["step"], []).append(record)
    return by_step


def dev_summary(records: Sequence[Mapping[str, Any]], golds: Mapping[str, str]) -> dict[str, Any]:
    """What one validation's dev records hold: inputs, micro-F1, per-field P/R, entities."""
    return {
        "inputs": len(records),
        "dev_micro_f1": float(micro_f1(counts_of([r["scores"] for r in records]).sum(0))),
        "fields": field_statistics(records, FIELDS, output_fields, golds),
        "entities_per_output": entities_per_output(records),
    }


def pilot_rows(
    run: Path, golds: Mapping[str, str], start: Path | None = None, rival: Path | None = None
) -> list[dict[str, Any]]:
    """One row per validation step of the run's dev record (module docstring). `start`: the
    folder whose dev record at step 0 is step 0 (default: the run's own); `rival`: a folder
    whose step-0 record every later step is also compared with ("vs_rival")."""
    start = start or run
    by_step = {**records_by_step(run), 0: records_by_step(start).get(0, [])}
    if not by_step[0]:
        raise AggregationError(f"{start}: no dev record at step 0 (validation.jsonl)")
    steps = sorted(by_step)
    series = read_metrics(run)
    rows = []
    for i, step in enumerate(steps):
        row = {
            "step": step,
            **dev_summary(by_step[step], golds),
            "difference": paired_dev_interval(run, start, step, 0) if i else None,
            "forward_passes": dict(curve(series, "train/forward_passes")).get(step - 1),
        }
        if rival is not None:
            row["vs_rival"] = paired_dev_interval(run, rival, step, 0) if i else None
        for key, column in TRAINING:
            row[column] = window_mean(series, key, steps[i - 1] if i else 0, step) if i else None
        rows.append(row)
    return rows


def entities_per_output(rows: Sequence[Mapping[str, Any]], key: str = "prediction") -> float:
    """Mean number of filled fields per output (`key`: the rows' output field)."""
    filled = [sum(bool(v) for v in output_fields(r[key]).values()) for r in rows]
    return sum(filled) / max(len(filled), 1)


def interval_cell(diff: Sequence[float] | None) -> str:
    """A paired difference (difference, low, high, ...) as `+d [+lo, +hi]`; – for none."""
    return "–" if diff is None else f"{diff[0]:+.3f} [{diff[1]:+.3f}, {diff[2]:+.3f}]"


def markdown(rows: Sequence[Mapping[str, Any]], rival: str | None = None) -> str:
    """The pilot's table: one line per validation step (with `rival`, the name of the rows'
    "vs_rival" reference, a column of the differences from it)."""
    head = ["step", "dev micro-F1", "Δ vs step 0 [95%]"]
    head += [f"Δ vs {rival} [95%]"] if rival else []
    head += [*(f"{f} P/R" for f in FIELDS), "entities / output"]
    head += [*(column for _, column in TRAINING), "forward calls"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["step"]), f"{row['dev_micro_f1']:.3f}", interval_cell(row["difference"])]
        cells += [interval_cell(row.get("vs_rival"))] if rival else []
        cells += [
            f"{row['fields'][f]['precision']:.2f}/{row['fields'][f]['recall']:.2f}" for f in FIELDS
        ]
        cells.append(f"{row['entities_per_output']:.2f}")
        cells += ["–" if row[c] is None else f"{row[c]:.2f}" for _, c in TRAINING]
        cells.append("–" if row["forward_passes"] is None else f"{row['forward_passes']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the pilot's run directory")
    parser.add_argument("--out", type=Path, required=True, help="folder for pilot.md, pilot.json")
    parser.add_argument("--step-0", type=Path, help="where step 0 is (default: the run)")
    parser.add_argument(
        "--rival", type=Path, help="a folder whose step 0 every step is read against"
    )
    parser.add_argument("--rival-name", default="rival", help="the rival's name in the table")
    args = parser.parse_args(argv)
    rows = pilot_rows(args.run, dev_golds(args.run), args.step_0, args.rival)
    text = markdown(rows, args.rival_name if args.rival else None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pilot.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    (args.out / "pilot.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
