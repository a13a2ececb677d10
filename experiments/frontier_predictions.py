"""The frontier study's pre-registered predictions, from its diagnosis records and its plan:

    python -m experiments.frontier_predictions experiments/results/frontier \
        --out experiments/results/frontier-predictions.md

Reads `<folder>/plan.yaml` (per task: its diagnosis command, test draw and training budget) and
`<folder>/diagnosis/<task>_s<seed>/diagnosis.json` (one `mode=diagnose` per sampler seed) and
writes the predictions file: one line per task (the diagnosis's outlook, training λ and blind
fields, each over the sampler seeds), then how much each moved between the seeds, then the plan.
A task's prediction is what at least two of its three seeds say (`consensus`); the study trains
at the λ so predicted, or where no λ is recommended for training, at the reranking λ so
predicted, predicting that training empties outputs. The same records give the same file,
byte for byte: the write-up reads the JSON beside it.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

NONE = "none"  # no λ recommended for training: every λ's argmax is emptier than greedy's


def consensus(values: Sequence[Any]) -> Any:
    """The value more than half of the seeds give; else "split"."""
    value, count = Counter(values).most_common(1)[0]
    return value if 2 * count > len(values) else "split"


def field_consensus(per_seed: Sequence[Sequence[str]]) -> list[str]:
    """The fields more than half of the seeds name, in order of first appearance."""
    counts = Counter(name for names in per_seed for name in names)
    return [n for n in counts if 2 * counts[n] > len(per_seed)]


def seed_record(diagnosis: dict[str, Any]) -> dict[str, Any]:
    """What one diagnosis predicts: outlook, λ's, lift, fields, seconds."""
    verdict, curve = diagnosis["verdict"], diagnosis["candidates"]
    crossfit = curve.get("crossfit")
    training = verdict.get("training_lambda")
    return {
        "seed": diagnosis["settings"]["seed"],
        "outlook": verdict["outlook"],
        "reranking_lambda": verdict["reranking_lambda"],
        "training_lambda": NONE if training is None else training,
        "greedy": curve["greedy"]["value"],
        "lift": None if crossfit is None else crossfit["lift"],
        "lift_interval": None if crossfit is None else crossfit["interval"],
        "blind": verdict["blind"],
        "undecided": verdict.get("undecided", []),
        "seen": verdict["seen"],
        "seconds": round(sum(diagnosis["seconds"].values())),
    }


def task_prediction(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """The task's prediction: each quantity's consensus over its seeds, and the λ to train at."""
    training = consensus([s["training_lambda"] for s in seeds])
    reranking = consensus([s["reranking_lambda"] for s in seeds])
    train_at = training if training not in (NONE, "split") else reranking
    if train_at == "split":  # three different λ's: the middle one
        train_at = sorted(s["reranking_lambda"] for s in seeds)[len(seeds) // 2]
    return {
        "outlook": consensus([s["outlook"] for s in seeds]),
        "reranking_lambda": reranking,
        "training_lambda": training,
        "train_at": train_at,
        "empties": training == NONE,
        "blind": field_consensus([s["blind"] for s in seeds]),
        "undecided": field_consensus([s["undecided"] for s in seeds]),
        "seeds": seeds,
    }


def predictions(folder: Path) -> dict[str, Any]:
    """Every task of the plan with its prediction (the seeds' diagnosis records read)."""
    plan = yaml.safe_load((folder / "plan.yaml").read_text())
    tasks = {}
    for name, spec in plan["tasks"].items():
        records = []
        for seed in plan["sampler_seeds"]:
            path = folder / "diagnosis" / f"{name}_s{seed}" / "diagnosis.json"
            if not path.is_file():
                raise SystemExit(f"{path}: missing (run the task's diagnosis at seed={seed})")
            records.append(seed_record(json.loads(path.read_text())))
        tasks[name] = {**task_prediction(records), "plan": spec}
    return {"plan": {k: v for k, v in plan.items() if k != "tasks"}, "tasks": tasks}


def _lam(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def _seeds(task: dict[str, Any], key: str) -> str:
    return " / ".join(_lam(s[key]) for s in task["seeds"])


def _lifts(task: dict[str, Any]) -> str:
    lifts = [s for s in task["seeds"] if s["lift"] is not None]
    if not lifts:
        return "no dev gold"
    return " / ".join(
        f"{s['lift']:+.3f} [{s['lift_interval'][0]:+.3f}, {s['lift_interval'][1]:+.3f}]"
        for s in lifts
    )


def _fields(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "none"


def render(data: dict[str, Any]) -> str:
    """The predictions file (Markdown)."""
    plan = data["plan"]
    lines = [plan["preamble"].rstrip(), "", "## Predictions", ""]
    lines += [
        "| task | outlook | train at λ | training empties outputs | blind fields | undecided |",
        "|---|---|:-:|:-:|---|---|",
    ]
    for name, task in data["tasks"].items():
        lines.append(
            f"| {name} | {task['outlook']} | {_lam(task['train_at'])} | "
            f"{'yes' if task['empties'] else 'no'} | {_fields(task['blind'])} | "
            f"{_fields(task['undecided'])} |"
        )
    seeds = "/".join(str(s) for s in plan["sampler_seeds"])
    lines += ["", f"## Between sampler seeds {seeds}", ""]
    lines += [
        "| task | outlook | reranking λ | training λ | cross-fitted lift [95%] | blind | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, task in data["tasks"].items():
        blind = " / ".join(_fields(s["blind"]) for s in task["seeds"])
        lines.append(
            f"| {name} | {_seeds(task, 'outlook')} | {_seeds(task, 'reranking_lambda')} | "
            f"{_seeds(task, 'training_lambda')} | {_lifts(task)} | {blind} | "
            f"{' / '.join(str(s['seconds']) for s in task['seeds'])} |"
        )
    lines += ["", "## Plan", ""]
    lines += ["| task | test draw | training budget | diagnosis command |", "|---|---|---|---|"]
    for name, task in data["tasks"].items():
        spec = task["plan"]
        lines.append(f"| {name} | {spec['test']} | {spec['training']} | `{spec['diagnose']}` |")
    lines += ["", plan["rules"].rstrip(), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="holds plan.yaml and diagnosis/")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown file; .json beside")
    args = parser.parse_args(argv)
    data = predictions(args.folder)
    args.out.write_text(render(data))
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    print(
        json.dumps(
            {
                name: {k: t[k] for k in ("outlook", "train_at", "empties", "blind")}
                for name, t in data["tasks"].items()
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
