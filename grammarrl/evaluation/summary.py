"""The end of a training run: the frozen model and the trained adapter compared on the same test
sets, printed and written into the run directory (`summary.md`, `summary.json`), and the
training curves (`training.png`: the reward and the dev metric by step; `grammarrl.evaluation.curves`).

The comparison holds, for greedy constrained decoding of each: the task metric (mean ± std over
the test sets, and the paired difference per set), validity, and the mean training reward of
the greedy outputs, r = (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse under the run's λ and
σ's (the objective itself, scored by the frozen reference when `eval.score_rewards=true`),
plus the outputs that changed and three before/after examples.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grammarrl.evaluation.curves import read_metrics, training_facts, training_figure, training_line
from grammarrl.rl.rloo import combine_rewards
from grammarrl.runs.atomic import atomic_write, write_json
from grammarrl.runs.results import mean_std, predictions_name
from grammarrl.tasks.base import Task
from grammarrl.types import Example

NUM_EXAMPLES = 3  # before/after examples shown


def set_rewards(
    results: Mapping[str, Any], lam: float, sigma_direct: float, sigma_reverse: float
) -> list[float] | None:
    """Per test set: the mean training reward of the outputs (the combined reward of their
    mean R_direct and R_reverse; `rloo.combine_rewards` is linear). None when the evaluation
    did not score rewards."""
    per_set = results.get("per_set") or []
    if not per_set or any("reward_direct" not in s for s in per_set):
        return None
    direct = torch.tensor([s["reward_direct"] for s in per_set], dtype=torch.float64)
    reverse = torch.tensor([s["reward_reverse"] for s in per_set], dtype=torch.float64)
    return combine_rewards(direct, reverse, lam, sigma_direct, sigma_reverse).tolist()


def _stats(values: Sequence[float] | None) -> dict[str, Any] | None:
    if values is None:
        return None
    mean, std = mean_std(values)
    return {"mean": mean, "std": std, "per_set": [float(v) for v in values]}


def _read_predictions(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    path = Path(results["path"])
    name = predictions_name(path.stem)
    with open(path.parent / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _example_score(task: Task, prediction: str, row: Mapping[str, Any]) -> float:
    """The task metric of one output against its gold output."""
    example = Example(uid=row["uid"], input=row["input"], target=row["gold"])
    return float(task.score([prediction], [example]).value)


def compare(
    task: Task,
    frozen: Mapping[str, Any],
    trained: Mapping[str, Any],
    lam: float,
    sigma_direct: float,
    sigma_reverse: float,
) -> dict[str, Any]:
    """Frozen vs trained greedy decoding on the same test sets: metric, validity, reward of the
    greedy outputs, the paired difference per set, the changed outputs and three examples."""
    if frozen["scores"] and len(frozen["scores"]) != len(trained["scores"]):
        raise ValueError("frozen and trained were evaluated on different numbers of test sets")
    systems = {
        name: {
            "metric": _stats(res["scores"]),
            "validity": res["validity"],
            "truncated": res["truncated"],
            "reward": _stats(set_rewards(res, lam, sigma_direct, sigma_reverse)),
        }
        for name, res in (("frozen", frozen), ("trained", trained))
    }
    diff = [t - f for f, t in zip(frozen["scores"], trained["scores"])]
    rewards = [systems[name]["reward"] for name in ("frozen", "trained")]
    reward_diff = None
    if all(rewards):
        reward_diff = [t - f for f, t in zip(rewards[0]["per_set"], rewards[1]["per_set"])]
    before = {row["uid"]: row for row in _read_predictions(frozen)}
    after = {row["uid"]: row for row in _read_predictions(trained)}
    if set(before) != set(after):
        raise ValueError("frozen and trained predictions cover different test examples")
    changed = changed_outputs(task, before, after)
    better = sum(item.get("trained_score", 0) > item.get("frozen_score", 0) for item in changed)
    worse = sum(item.get("trained_score", 0) < item.get("frozen_score", 0) for item in changed)
    unchanged = [_pair(row, after[uid]) for uid, row in list(before.items())[:NUM_EXAMPLES]]
    return {
        "task": trained["task"],
        "model": trained["model"],
        "metric_name": trained["metric"],
        "lambda": lam,
        "sigma_direct": sigma_direct,
        "sigma_reverse": sigma_reverse,
        "num_test_sets": len(trained["scores"]),
        "test_size": trained.get("test_size"),
        "test_set_drawing": trained.get("test_set_drawing", "seed_plus_index"),
        "distinct_examples": len(before),
        "frozen": systems["frozen"],
        "trained": systems["trained"],
        "difference": {"metric": _stats(diff), "reward": _stats(reward_diff)},
        "verdict": verdict(diff, frozen["scores"], trained["scores"]),
        "changed": {
            "outputs": len(changed),
            "better": better,
            "worse": worse,
            "same_score": len(changed) - better - worse,
        },
        "examples": pick_examples(changed) or unchanged,
    }


def _pair(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """One example's input, frozen and trained outputs and gold."""
    return {
        "input": old["input"],
        "frozen": old["prediction"],
        "trained": new["prediction"],
        "gold": old["gold"],
    }


def changed_outputs(
    task: Task, before: Mapping[str, Any], after: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The distinct examples (in the first set's order) whose output training changed, each
    with both scores when it has a gold output."""
    changed = []
    for uid, old in before.items():
        new = after[uid]
        if old["prediction"] == new["prediction"]:
            continue
        item = _pair(old, new)
        if old["gold"]:
            item["frozen_score"] = _example_score(task, old["prediction"], old)
            item["trained_score"] = _example_score(task, new["prediction"], new)
        changed.append(item)
    return changed


def pick_examples(changed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Up to three changed outputs, in this order (the summary's heading promises it): the
    first in test order that scored better, the first worse, the first the same, then the next
    changed ones in test order."""

    def kind(item: dict[str, Any]) -> str:
        if "frozen_score" not in item:
            return "unscored"
        delta = item["trained_score"] - item["frozen_score"]
        return "better" if delta > 0 else "worse" if delta < 0 else "same"

    picked = [next((i for i in changed if kind(i) == k), None) for k in ("better", "worse", "same")]
    picked = [i for i in picked if i is not None]
    for item in changed:
        if len(picked) >= NUM_EXAMPLES:
            break
        if all(item is not p for p in picked):
            picked.append(item)
    return picked[:NUM_EXAMPLES]


def verdict(diff: Sequence[float], frozen: Sequence[float], trained: Sequence[float]) -> str:
    """Whether training shows an effect: the mean paired difference against the spread of the
    metric over test sets (the larger std of the two systems)."""
    mean, _ = mean_std(diff)
    if len(diff) < 2:
        return (
            f"one test set: trained − frozen = {mean:+.4f}, with no spread over test sets "
            "to compare it with (eval.num_test_sets=1)"
        )
    spread = max(mean_std(frozen)[1], mean_std(trained)[1])
    if math.isnan(mean):
        return "no metric (unlabelled test sets)"
    if abs(mean) <= spread:
        return (
            f"no effect shown: trained − frozen = {mean:+.4f} is within the spread over "
            f"test sets (std up to {spread:.4f})"
        )
    direction = "better" if mean > 0 else "worse"
    every = all(d > 0 for d in diff) if mean > 0 else all(d < 0 for d in diff)
    return (
        f"trained is {direction} than frozen: {mean:+.4f}, beyond the spread over test sets "
        f"(std up to {spread:.4f}){'; on every set' if every else ''}"
    )


def _pm(stats: Mapping[str, Any] | None, signed: bool = False) -> str:
    if stats is None:
        return "not scored"
    return f"{stats['mean']:{'+' if signed else ''}.4f} ± {stats['std']:.4f}"


def _describe_sets(summary: Mapping[str, Any]) -> str:
    sets, size, distinct = (
        summary["num_test_sets"],
        summary["test_size"],
        summary["distinct_examples"],
    )
    if sets == 1:
        return f"one test set of {size} examples"
    overlap = " (they overlap)" if distinct < sets * (size or 0) else ""
    drawing = summary.get("test_set_drawing", "seed_plus_index")
    how = (
        "cut from the test pool in one fixed order (eval.test_set_drawing=disjoint)"
        if drawing == "disjoint"
        else f"drawn from the test pool with seeds seed+0..{sets - 1}"
    )
    return (
        f"{sets} test sets of {size} examples {how}, {distinct} distinct{overlap}; mean ± std "
        "over the sets"
    )


def render(summary: Mapping[str, Any], training: Mapping[str, Any] | None = None) -> str:
    """The summary as Markdown (also what is printed)."""
    metric = summary["metric_name"]
    lines = [
        f"# GrammarRL: {summary['task']}, {summary['model']}, λ={summary['lambda']:g}",
        "",
        (
            f"Frozen model vs trained adapter, both decoding greedily under the grammar, on the "
            f"same {_describe_sets(summary)}."
        ),
        "",
        f"| greedy | {metric} | training reward of the greedy outputs | validity |",
        "|---|---|---|---|",
    ]
    for name in ("frozen", "trained"):
        system = summary[name]
        lines.append(
            f"| {name} | {_pm(system['metric'])} | {_pm(system['reward'])} | "
            f"{system['validity']:.3f} |"
        )
    diff = summary["difference"]
    lines += [
        (
            f"| trained − frozen (paired per set) | {_pm(diff['metric'], signed=True)} | "
            f"{_pm(diff['reward'], signed=True)} | |"
        ),
        "",
        f"**{summary['verdict'][0].upper()}{summary['verdict'][1:]}.**",
        "",
        (
            f"Reward: r = (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse with σ_direct="
            f"{summary['sigma_direct']:.4f}, σ_reverse={summary['sigma_reverse']:.4f}, scored by the "
            "frozen model; the objective training maximises (higher is better)."
        ),
    ]
    changed = summary["changed"]
    lines += [
        "",
        (
            f"Outputs changed by training: {changed['outputs']} of "
            f"{summary['distinct_examples']} distinct test inputs ({changed['better']} scored "
            f"better, {changed['worse']} worse, {changed['same_score']} the same)."
        ),
    ]
    if training:
        lines += ["", training_line(training)]
    return "\n".join(lines + _example_lines(summary)) + "\n"


def _example_lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary's examples section: input, both outputs and gold of each example."""
    lines = [
        "",
        "## Before and after (changed test inputs: the first that scored better, "
        "the first worse, the first the same)"
        if summary["changed"]["outputs"]
        else "## Examples (no output changed)",
    ]
    for index, item in enumerate(summary["examples"], 1):
        scores = ""
        if "frozen_score" in item:
            scores = (
                f" ({summary['metric_name']} {item['frozen_score']:.2f} → "
                f"{item['trained_score']:.2f})"
            )
        lines += [
            "",
            f"{index}. input: {item['input']}{scores}",
            f"   - frozen:  `{item['frozen']}`",
            f"   - trained: `{item['trained']}`",
            f"   - gold:    `{item['gold']}`",
        ]
    return lines


def write_summary(
    out: Path,
    task: Task,
    results: Mapping[str, Mapping[str, Any]],
    lam: float,
    sigma_direct: float,
    sigma_reverse: float,
) -> dict[str, Any] | None:
    """`summary.md`, `summary.json` and `training.png` in the run directory `out`, from the
    greedy evaluations of the frozen model (`results['baseline']`) and the trained adapter
    (`results['greedy']`); returns the summary (None without a frozen evaluation)."""
    if "baseline" not in results or "greedy" not in results:
        return None
    summary = compare(
        task, results["baseline"], results["greedy"], lam, sigma_direct, sigma_reverse
    )
    series = read_metrics(out)
    summary["training"] = training_facts(series, summary["metric_name"]) if series else None
    figure = training_figure(series, summary["metric_name"], out / "training.png")
    summary["figure"] = str(figure) if figure else None
    text = render(summary, summary["training"])
    if figure:
        text += f"\nCurves: {figure.name} (reward and {summary['metric_name']} by step).\n"
    atomic_write(out / "summary.md", lambda handle: handle.write(text))
    write_json(out / "summary.json", summary)
    summary["text"] = text
    return summary
