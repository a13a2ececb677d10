"""The frontier study's outcomes, set against its predictions (issue 54):

    python -m experiments.frontier_report experiments/results/frontier \\
        --out experiments/results/frontier/report

Reads `frontier-predictions.json` beside FOLDER and the run records under `FOLDER/runs/<task>/`
(one folder per system), and writes per task the comparison of `experiments.aggregate compare`
(`<task>/comparison.md`, `.json`, the frontier plot), and `outcomes.md` / `outcomes.json`: per
task, each prediction beside what was measured on the task's test draw:

- outlook: trained greedy − frozen greedy, its paired 95% interval over the test examples;
  `likely` is borne out when the interval lies above 0, `marginal`/`unlikely` when it does not;
- training empties outputs: the mean number of filled JSON fields per output, trained against
  frozen greedy (paired interval); "yes" is borne out when the interval lies below 0;
- blind fields: each field's F1 change, trained − frozen greedy (paired interval); a blind field
  is borne out when the interval does not lie above 0; undecided fields are shown, not judged;
- the search systems: trained greedy against Sample-Rerank(10) and Full IS(10), and Full IS(3)
  with the trained proposal against Full IS(10) with the frozen one, with their cost ratios.

A task whose runs are not all in yet shows what is there and "not run" for the rest.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.compare import comparison, comparison_table
from experiments.frontier import frontier_plots
from experiments.intervals import RESAMPLES, SEED
from experiments.paired import Counts, paired_interval
from experiments.results_files import read_rows, source
from experiments.runs import AggregationError, Evaluation, load_sweep
from experiments.table_format import to_markdown
from grammarrl.tasks.conll import output_fields
from grammarrl.tasks.custom_metrics import field_values
from grammarrl.tasks.metrics import field_prf

Interval = tuple[float, float, float]  # observed, 2.5th and 97.5th percentile


def _find(data: dict[str, Any], **wanted: Any) -> dict[str, Any] | None:
    """The comparison's system whose key holds every wanted value (weights: one of a tuple)."""
    for system in data["systems"]:
        key = system["key"]
        if all(
            key.get(k) in v if isinstance(v, tuple) else key.get(k) == v for k, v in wanted.items()
        ):
            return system
    return None


def _systems(data: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    """The study's systems (plan.yaml, "Systems on each test draw") in one task's comparison."""
    trained = ("trained", "adapter")
    found = {
        "frozen greedy": _find(data, weights="frozen", decoding="greedy"),
        "frozen beam(3)": _find(data, weights="frozen", decoding="beam", beam_width=3),
        "GrammarRL greedy": _find(data, weights=trained, decoding="greedy"),
        "Full IS(3), trained proposal": _find(
            data, weights=trained, method="is", selection="is", particles=3
        ),
    }
    for k in (3, 10):
        for method, name in (("rerank", "Sample-Rerank"), ("is", "Full IS")):
            found[f"{name}({k})"] = _find(
                data, weights="frozen", method="is", selection=method, particles=k
            )
    return found


def _fields(task: str, text: str | None) -> dict[str, str]:
    """An output's fields as compared strings ("" when empty): CoNLL's four, a custom task's
    JSON object's (`field_values`); none for an output that is not an object (a label)."""
    if task == "conll":
        return output_fields(text or "")
    try:
        return field_values(json.loads(text)) if text is not None else {}
    except json.JSONDecodeError:
        return {}


Rows = dict[int, dict[str, dict[str, Any]]]  # test set -> uid -> predictions row


def _greedy_rows(system: dict[str, Any], evals: dict[str, Evaluation]) -> Rows:
    """A deterministic system's predictions rows by test set and uid."""
    found: Rows = {}
    for run in system["runs"]:
        for row in read_rows(evals[run]):
            found.setdefault(int(row["set"]), {})[row["uid"]] = row
    return found


def _paired_mean(system: Rows, reference: Rows, value: Callable[[dict], float]) -> Interval:
    """Mean over sets of the per-set mean of value(system row) − value(reference row), with its
    paired 95% bootstrap over each set's examples (the comparison's resamples and seed)."""
    if {s: r.keys() for s, r in system.items()} != {s: r.keys() for s, r in reference.items()}:
        raise AggregationError("filled fields: the two systems decoded different examples")
    rng = np.random.default_rng(SEED)
    observed, resampled = 0.0, np.zeros(RESAMPLES)
    for index in sorted(reference):
        uids = sorted(reference[index])
        diffs = np.array([value(system[index][u]) - value(reference[index][u]) for u in uids])
        observed += float(diffs.mean())
        resampled += diffs[rng.integers(0, len(diffs), size=(RESAMPLES, len(diffs)))].mean(1)
    low, high = np.percentile(resampled / len(reference), [2.5, 97.5])
    return observed / len(reference), float(low), float(high)


def _field_counts(task: str, rows: Rows, name: str) -> Counts:
    """Per set and uid, one field's [tp, fp, fn] (`metrics.field_prf`, CoNLL's rule per field)."""
    counts: Counts = {}
    for index, by_uid in rows.items():
        for uid, row in by_uid.items():
            prf = field_prf(
                _fields(task, row["prediction"]).get(name, ""),
                _fields(task, row["gold"]).get(name, ""),
            )
            counts.setdefault(index, {})[uid] = np.array([prf.tp, prf.fp, prf.fn])
    return counts


def _versus(system: dict[str, Any] | None, reference: dict[str, Any] | None) -> Interval | None:
    """system − reference from the comparison (examples and draws), where both exist."""
    if system is None or reference is None:
        return None
    found = next((v for v in system["versus"] if v["reference"] == reference["label"]), None)
    boot = found and found["bootstrap"]
    if not boot:
        return None
    both = boot["examples_and_draws"]
    return both["observed"], both["low"], both["high"]


def _judge(found: Interval | None, above: bool) -> str:
    """Whether an interval bears a prediction out: above 0 (or, `above` False, not above 0)."""
    if found is None:
        return "not run"
    return "yes" if (found[1] > 0) == above else "**no**"


def _cell(found: Interval | None) -> str:
    return "not run" if found is None else f"{found[0]:+.3f} [{found[1]:+.3f}, {found[2]:+.3f}]"


def task_outcome(name: str, predicted: dict[str, Any], runs: Path, out: Path) -> dict[str, Any]:
    """One task's comparison files under `out/<name>/` and its outcomes (module docstring)."""
    evals = load_sweep([runs]).evaluations()
    by_source = {source(ev): ev for ev in evals}
    systems = _systems(comparison(evals))
    wanted = ("frozen greedy", "GrammarRL greedy", "Full IS(10)")
    refs = [systems[w]["label"] for w in wanted if systems[w] is not None]
    data = comparison(evals, refs)
    systems = _systems(data)
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "comparison.md").write_text(to_markdown(comparison_table(data)))
    (out / name / "comparison.json").write_text(json.dumps(data, indent=1) + "\n")
    frontier_plots(data, out / name)
    frozen, trained = systems["frozen greedy"], systems["GrammarRL greedy"]
    found: dict[str, Any] = {"task": name, "predicted": predicted, "systems": {}}
    for label, system in systems.items():
        cost = system and system["cost"]
        found["systems"][label] = system and {
            "mean": system["mean"],
            "tokens_per_output": cost and cost["tokens_per_output"],
            "sets": system["num_sets"],
            "draws": system["draws_max"],
            "examples": system["num_examples"],
        }
    found["gain"] = _versus(trained, frozen)
    for search in ("Sample-Rerank(10)", "Full IS(10)"):
        ahead = _versus(systems[search], trained)
        found[f"trained vs {search}"] = ahead and (-ahead[0], -ahead[2], -ahead[1])
    found["IS(3) trained vs IS(10) frozen"] = _versus(
        systems["Full IS(3), trained proposal"], systems["Full IS(10)"]
    )
    found["filled"], found["fields"] = None, {}
    if frozen is not None and trained is not None:
        task = frozen["key"]["task"]
        mine, theirs = _greedy_rows(trained, by_source), _greedy_rows(frozen, by_source)
        first = next(iter(theirs[min(theirs)].values()))
        names = list(_fields(task, first["gold"]))
        if names:
            found["filled"] = _paired_mean(
                mine, theirs, lambda row: sum(map(bool, _fields(task, row["prediction"]).values()))
            )
        for field in names:
            counts = (_field_counts(task, rows, field) for rows in (mine, theirs))
            found["fields"][field] = paired_interval(*counts)[:3]
    return found


def _fields_cell(outcome: dict[str, Any], names: Sequence[str], judged: bool) -> str:
    """Each named field's F1 change (and, for blind fields, whether it bears the call out)."""
    if not names:
        return "none"
    cells = []
    for field in names:
        change = outcome["fields"].get(field)
        verdict = f" ({_judge(change, above=False)})" if judged and change else ""
        cells.append(f"`{field}` {_cell(change)}{verdict}")
    return "; ".join(cells)


def outcomes_markdown(outcomes: Sequence[dict[str, Any]]) -> str:
    """The two tables of outcomes.md: predictions against outcomes, and the search systems."""
    lines = [
        (
            "| task | outlook | trained − frozen greedy [95%] | borne out | empties outputs | "
            "filled fields, trained − frozen [95%] | blind fields: F1 change (borne out) | "
            "undecided: F1 change |"
        ),
        "|---|---|:-:|:-:|:-:|:-:|---|---|",
    ]
    for o in outcomes:
        p = o["predicted"]
        gain = o["gain"]
        outlook = "not judged" if p["outlook"] in ("unmeasured", "split") else None
        borne = outlook or _judge(gain, above=p["outlook"] == "likely")
        empties = "yes" if p["empties"] else "no"
        filled = o["filled"]
        if filled is not None and gain is not None:
            empties += f" ({_judge((-filled[0], -filled[2], -filled[1]), above=p['empties'])})"
        lines.append(
            f"| {o['task']} | {p['outlook']} | {_cell(gain)} | {borne} | {empties} | "
            f"{'n/a' if filled is None else _cell(filled)} | "
            f"{_fields_cell(o, p['blind'], True)} | {_fields_cell(o, p['undecided'], False)} |"
        )
    lines += [
        "",
        (
            "| task | frozen greedy | GrammarRL greedy | Sample-Rerank(10) | Full IS(10) | "
            "trained − Sample-Rerank(10) [95%] | trained − Full IS(10) [95%] | Full IS(10) cost "
            "÷ greedy | Full IS(3) trained − Full IS(10) frozen [95%] |"
        ),
        "|---|:-:|:-:|:-:|:-:|:-:|:-:|:-:|:-:|",
    ]
    for o in outcomes:
        s = o["systems"]
        mean = lambda label, s=s: "not run" if s[label] is None else f"{s[label]['mean']:.3f}"
        ratio = "not run"
        if s["Full IS(10)"] and s["GrammarRL greedy"]:
            greedy = s["GrammarRL greedy"]["tokens_per_output"]
            ratio = f"{s['Full IS(10)']['tokens_per_output'] / greedy:.1f}×"
        lines.append(
            f"| {o['task']} | {mean('frozen greedy')} | {mean('GrammarRL greedy')} | "
            f"{mean('Sample-Rerank(10)')} | {mean('Full IS(10)')} | "
            f"{_cell(o['trained vs Sample-Rerank(10)'])} | {_cell(o['trained vs Full IS(10)'])} | "
            f"{ratio} | {_cell(o['IS(3) trained vs IS(10) frozen'])} |"
        )
    return "\n".join(lines) + "\n"


def report(folder: Path, out: Path) -> list[dict[str, Any]]:
    """Every task with runs under `folder/runs/`, in the predictions' order; writes `out/`."""
    predictions = json.loads((folder.parent / "frontier-predictions.json").read_text())["tasks"]
    unknown = sorted(
        {p.name for p in (folder / "runs").iterdir() if p.is_dir()} - predictions.keys()
    )
    if unknown:
        raise AggregationError(f"{folder / 'runs'}: no prediction for {', '.join(unknown)}")
    outcomes = [
        task_outcome(name, predicted, folder / "runs" / name, out)
        for name, predicted in predictions.items()
        if (folder / "runs" / name).is_dir()
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "outcomes.md").write_text(outcomes_markdown(outcomes))
    (out / "outcomes.json").write_text(json.dumps(outcomes, indent=1) + "\n")
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.frontier_report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("folder", type=Path, help="experiments/results/frontier")
    parser.add_argument("--out", type=Path, help="default FOLDER/report")
    args = parser.parse_args(argv)
    try:
        outcomes = report(args.folder, args.out or args.folder / "report")
    except AggregationError as err:
        raise SystemExit(f"error: {err}") from None
    print(json.dumps({o["task"]: _cell(o["gain"]) for o in outcomes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
