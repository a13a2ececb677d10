"""The end of a training run: the frozen model and the trained adapter compared on the same test
sets, printed and written into the run directory (`summary.md`, `summary.json`), and the
training curves (`training.png`: the reward and the dev metric by step).

The comparison holds, for greedy constrained decoding of each: the task metric (mean ± std over
the test sets, and the paired difference per set), validity, and the mean training reward of
the greedy outputs, r = (1-λ)·R_direct/σ_direct + λ·R_reverse/σ_reverse under the run's λ and
σ's (the objective itself, scored by the frozen reference when `eval.score_rewards=true`),
plus the outputs that changed and three before/after examples.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grammarrl.atomic import atomic_write, write_json
from grammarrl.results import mean_std, predictions_name
from grammarrl.rloo import combine_rewards
from grammarrl.tasks.base import Task
from grammarrl.types import Example

NUM_EXAMPLES = 3  # before/after examples shown


def read_metrics(run: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Lightning's CSV metrics of a training run directory: column -> [(step, value)], empty
    cells skipped; {} when the run logged nothing. A validation row is placed at the training
    steps done when it ran (its `val/*_trained_steps`; 0 for the one before training)."""
    path = Path(run) / "metrics" / "metrics.csv"
    if not path.is_file():
        return {}
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = next(
                (v for k, v in row.items() if k.endswith("_trained_steps") and v), row.get("step")
            )
            for key, value in row.items():
                if key != "step" and value not in ("", None) and step not in ("", None):
                    series[key].append((int(float(step)), float(value)))
    return dict(series)


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
    systems = {}
    for name, res in (("frozen", frozen), ("trained", trained)):
        systems[name] = {
            "metric": _stats(res["scores"]),
            "validity": res["validity"],
            "truncated": res["truncated"],
            "reward": _stats(set_rewards(res, lam, sigma_direct, sigma_reverse)),
        }
    diff = [t - f for f, t in zip(frozen["scores"], trained["scores"])]
    reward_diff = None
    if systems["frozen"]["reward"] and systems["trained"]["reward"]:
        reward_diff = [
            t - f
            for f, t in zip(
                systems["frozen"]["reward"]["per_set"], systems["trained"]["reward"]["per_set"]
            )
        ]
    before = {row["uid"]: row for row in _read_predictions(frozen)}
    after = {row["uid"]: row for row in _read_predictions(trained)}
    if set(before) != set(after):
        raise ValueError("frozen and trained predictions cover different test examples")
    changed, better, worse = [], 0, 0
    for uid, old in before.items():  # distinct examples, in the first set's order
        new = after[uid]
        if old["prediction"] == new["prediction"]:
            continue
        item = {
            "input": old["input"],
            "frozen": old["prediction"],
            "trained": new["prediction"],
            "gold": old["gold"],
        }
        if old["gold"]:
            item["frozen_score"] = _example_score(task, old["prediction"], old)
            item["trained_score"] = _example_score(task, new["prediction"], new)
            better += item["trained_score"] > item["frozen_score"]
            worse += item["trained_score"] < item["frozen_score"]
        changed.append(item)
    sets, size = len(trained["scores"]), trained.get("test_size")
    return {
        "task": trained["task"],
        "model": trained["model"],
        "metric_name": trained["metric"],
        "lambda": lam,
        "sigma_direct": sigma_direct,
        "sigma_reverse": sigma_reverse,
        "num_test_sets": sets,
        "test_size": size,
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
        "examples": pick_examples(changed)
        or [
            {
                "input": row["input"],
                "frozen": row["prediction"],
                "trained": after[uid]["prediction"],
                "gold": row["gold"],
            }
            for uid, row in list(before.items())[:NUM_EXAMPLES]
        ],
    }


def pick_examples(changed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Up to three changed outputs, in test order: the first that scored better, the first
    that scored worse, the first that scored the same, then the next changed ones."""

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
    order = {id(item): n for n, item in enumerate(changed)}
    return sorted(picked[:NUM_EXAMPLES], key=lambda item: order[id(item)])


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
    return (
        f"{sets} test sets of {size} examples drawn from the test pool with seeds "
        f"seed+0..{sets - 1}, {distinct} distinct{overlap}; mean ± std over the sets"
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
    lines += [
        "",
        "## Before and after (changed test inputs: the first that scored better, "
        "the first worse, the first the same)"
        if changed["outputs"]
        else "## Examples (no output changed)",
    ]
    for index, item in enumerate(summary["examples"], 1):
        scores = ""
        if "frozen_score" in item:
            scores = f" ({metric} {item['frozen_score']:.2f} → {item['trained_score']:.2f})"
        lines += [
            "",
            f"{index}. input: {item['input']}{scores}",
            f"   - frozen:  `{item['frozen']}`",
            f"   - trained: `{item['trained']}`",
            f"   - gold:    `{item['gold']}`",
        ]
    return "\n".join(lines) + "\n"


def training_facts(
    series: Mapping[str, Sequence[tuple[int, float]]], metric: str
) -> dict[str, Any]:
    """Steps, the rollout reward at the first and last step, the share of rollout groups
    whose candidates were all identical (no signal), and the dev metric's first and last."""

    def ends(key: str) -> list[float] | None:
        points = series.get(key)
        return [points[0][1], points[-1][1]] if points else None

    identical = [v for _, v in series.get("train/identical_groups", [])]
    return {
        "steps": len(series.get("train/reward", [])),
        "rollout_reward": ends("train/reward"),
        "dev_metric": ends(f"val/dev_{metric}"),
        "dev_reward": ends("val/dev_reward"),
        "identical_groups": sum(identical) / len(identical) if identical else None,
        "silent_steps": sum(v >= 1.0 for v in identical),
    }


def training_line(facts: Mapping[str, Any]) -> str:
    parts = [f"Training: {facts['steps']} steps"]
    if facts["rollout_reward"]:
        parts.append(
            "rollout reward {:.3f} → {:.3f} (first → last step)".format(*facts["rollout_reward"])
        )
    if facts["dev_metric"]:
        parts.append("dev metric {:.3f} → {:.3f}".format(*facts["dev_metric"]))
    if facts["identical_groups"] is not None:
        parts.append(
            f"{facts['identical_groups']:.0%} of rollout groups had identical "
            f"candidates (no signal); {facts['silent_steps']} steps had no signal at all"
        )
    return "; ".join(parts) + "."


def training_figure(
    series: Mapping[str, Sequence[tuple[int, float]]], metric: str, path: Path
) -> Path | None:
    """reward and dev metric by step (`training.png`); None when nothing was logged."""
    from grammarrl.plots import panel_grid

    rewards = {
        "rollouts (train/reward)": series.get("train/reward", []),
        "greedy, dev slice (val/dev_reward)": series.get("val/dev_reward", []),
        "greedy, train slice (val/train_reward)": series.get("val/train_reward", []),
    }
    metrics = {
        f"dev slice (val/dev_{metric})": series.get(f"val/dev_{metric}", []),
        f"train slice (val/train_{metric})": series.get(f"val/train_{metric}", []),
    }
    panels = [
        (title, {k: v for k, v in lines.items() if v})
        for title, lines in (
            ("reward (λ-mixed, σ-scaled)", rewards),
            (f"{metric}, greedy", metrics),
        )
    ]
    if not any(lines for _, lines in panels):
        return None
    return panel_grid(panels, path, columns=2, ylabels=["reward", metric])


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
