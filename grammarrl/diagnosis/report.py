"""The diagnosis's files in the run directory: `diagnosis.json` (everything, written last: its
presence marks the job complete), `diagnosis.md` (the verdict first, then the tables) and
`diagnosis.png` (the λ curve; the per-field bars)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grammarrl.diagnosis.concordance import ALL
from grammarrl.evaluation.plots import line_style, plt, save_figure
from grammarrl.runs.atomic import atomic_write, write_json

JSON, MARKDOWN, PLOT = "diagnosis.json", "diagnosis.md", "diagnosis.png"


def _number(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _tally(tally: dict[str, Any], pairs: int, interval: bool = False) -> str:
    if not pairs:
        return "–"
    spread = ", {:.0%}–{:.0%}".format(*tally["interval"]) if interval else ""
    return f"{tally['gold_preferred']}/{pairs} ({tally['share']:.0%}{spread})"


def _lambda_name(lam: float, verdict: dict[str, Any]) -> str:
    """An argmax row's name, marked where it is the reranking or the training λ."""
    roles = [
        role
        for role, chosen in (("reranking", "reranking_lambda"), ("training", "training_lambda"))
        if verdict[chosen] == lam
    ]
    name = f"reward argmax, λ={lam:g}"
    return f"**{name}** ({' and '.join(roles)})" if roles else name


def curve_table(record: dict[str, Any]) -> list[str]:
    """The metric of greedy, oracle and the argmax per λ, with the per-field F1's and how full
    the outputs are."""
    curve, metric = record["candidates"], record["metric"]
    fields = [f for f in curve["greedy"]["fields"] if f != "micro"]
    head = (
        f"| | {metric} | {' | '.join(fields)}{' | ' if fields else ''}"
        f"{curve['fullness_unit']} / output | argmax ≠ greedy | reward gap (σ units) |"
    )
    lines = [head, "|---|" + ":-:|" * (len(fields) + 4)]

    def row(name: str, measured: dict[str, Any], changed: str, gap: str) -> str:
        cells = [_number(measured["value"]), *(_number(measured["fields"].get(f)) for f in fields)]
        full = _number(measured.get("fullness"), 2)
        return f"| {name} | {' | '.join(cells)} | {full} | {changed} | {gap} |"

    lines.append(row("greedy", curve["greedy"], "–", "–"))
    lines.append(row("oracle (best candidate per input)", curve["oracle"], "–", "–"))
    for point in curve["argmax"]:
        measured = {**point["metric"], "fullness": point["fullness"]}
        changed, gap = f"{point['changed']:.0%}", _number(point["reward_gap"], 2)
        lines.append(row(_lambda_name(point["lambda"], record["verdict"]), measured, changed, gap))
    return lines


def crossfit_line(record: dict[str, Any]) -> str:
    """The cross-fitted lift in one sentence, or why there is none."""
    crossfit, metric = record["candidates"].get("crossfit"), record["metric"]
    if crossfit is None:
        return "No cross-fitted lift: it needs at least two dev inputs with gold outputs."
    first, second = crossfit["lambdas"]
    low, high = crossfit["interval"]
    return (
        f"Cross-fitted lift (λ chosen on the odd-numbered labelled inputs, {first:g}, applied "
        f"to the even-numbered ones, and the other way round, {second:g}): {metric} "
        f"{crossfit['greedy']:.3f} → {crossfit['picked']:.3f}, {crossfit['lift']:+.3f}, 95% "
        f"interval [{low:+.3f}, {high:+.3f}] over {crossfit['draws']} resamples of the "
        f"{crossfit['inputs']} inputs. The table's per-λ rows are in-sample."
    )


def fields_table(record: dict[str, Any]) -> list[str]:
    """Per field: the pairs, and the share of them each reward prefers gold in."""
    table, lambdas = record["fields"]["table"], record["settings"]["lambdas"]
    head = "| field | pairs | direct | reverse (95% interval) | " + " | ".join(
        f"combined λ={lam:g}" for lam in lambdas
    )
    lines = [head + " | perturbations |", "|---|" + ":-:|" * (len(lambdas) + 3) + "---|"]
    for name, row in table.items():
        cells = [
            _tally(row["direct"], row["pairs"]),
            _tally(row["reverse"], row["pairs"], interval=True),
            *(_tally(row["combined"][str(lam)], row["pairs"]) for lam in lambdas),
        ]
        kinds = ", ".join(f"{kind} {n}" for kind, n in row["kinds"].items())
        label = "**all**" if name == ALL else f"`{name}`"
        lines.append(f"| {label} | {row['pairs']} | {' | '.join(cells)} | {kinds} |")
    return lines


def markdown(record: dict[str, Any]) -> str:
    """diagnosis.md: the verdict, the λ curve, the per-field table, the settings."""
    settings, curve, verdict = record["settings"], record["candidates"], record["verdict"]
    lines = [
        f"# Diagnosis: {record['task']} on {record['model']}",
        "",
        f"**Verdict ({verdict['outlook']}).** {verdict['text']}",
        "",
        "## Reranking the candidates by the reward",
        "",
        (
            f"{curve['inputs']} inputs ({curve['rows']}), {curve['labelled']} with a gold output; "
            f"each decoded greedily and sampled {settings['num_samples']} times under the grammar "
            f"(temperature {settings['temperature']:g}); {curve['finished_candidates']:.0%} of the "
            f"candidates ended within the token cap ({curve['valid_candidates']:.0%} non-empty), "
            f"{curve['distinct_share']:.0%} of the inputs have distinct ones. The reward's argmax picks the candidate with the highest "
            "(1-λ)·R_direct/σ_d + λ·R_reverse/σ_r; the oracle, the candidate with the best metric."
        ),
        "",
        *curve_table(record),
        "",
        crossfit_line(record),
        "",
        "## Which fields the reward can see",
        "",
    ]
    fields = record["fields"]
    if fields["table"]:
        lines += [
            (
                f"{fields['labelled']} labelled rows ({fields['rows']}); each gold output next to "
                f"{fields['how']}: the share of pairs in which each reward scores the gold output "
                "higher. Where the 95% interval of the share of a field's pairs in which the "
                "reverse reward (the term that reads the input) prefers gold lies below "
                f"{settings['blind_below']:.0%} (diagnose.blind_below), the reward cannot see the "
                "field: training moves it at random, or away from gold; where it straddles the "
                "line, the field is undecided: label more rows."
            ),
            "",
            *fields_table(record),
        ]
    else:
        lines.append(f"Not measured: {fields['rows']}.")
    return "\n".join(lines + settings_lines(record))


def settings_lines(record: dict[str, Any]) -> list[str]:
    """diagnosis.md's closing section: the σ's, the settings, the model, the phases' times."""
    settings, sigmas, seconds = record["settings"], record["sigmas"], record["seconds"]
    return [
        "",
        "## Settings",
        "",
        (
            f"- σ_direct {sigmas['direct']:.4f}, σ_reverse {sigmas['reverse']:.4f} "
            f"({sigmas['source']}), as training would use them."
        ),
        (
            f"- diagnose.num_inputs={settings['num_inputs']}, num_labelled={settings['num_labelled']}, "
            f"num_samples={settings['num_samples']}, "
            f"lambdas={settings['lambdas']}, bootstrap_draws={settings['bootstrap_draws']}, "
            f"seed={settings['seed']}; the config's λ is "
            f"{settings['config_lambda']:g}."
        ),
        f"- {record['model']} in {record['dtype']} on {record['device']}; "
        + ", ".join(f"{name} {value:.0f} s" for name, value in seconds.items())
        + ".",
        "",
        (
            f"Files: {JSON} (every number), {PLOT} (the λ curve, the per-field bars), "
            "diagnosis_rows.jsonl (each input's candidates and each perturbation pair)."
        ),
        "",
    ]


def plot(record: dict[str, Any], path: Path) -> Path:
    """Left: the argmax's metric against λ with greedy and oracle (without gold: how often the
    argmax is not greedy's output). Right: per field, the share of pairs each reward prefers
    gold in (combined at the reranking λ; the reverse reward's with its 95% interval)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    curve, lam = record["candidates"], record["verdict"]["reranking_lambda"]
    lambdas = [p["lambda"] for p in curve["argmax"]]
    if curve["greedy"]["value"] is not None:
        left.plot(lambdas, [p["metric"]["value"] for p in curve["argmax"]], marker="o",
                  label="reward argmax", **line_style(0))  # fmt: skip
        for i, name in enumerate(("greedy", "oracle"), start=1):
            left.axhline(curve[name]["value"], label=name, **line_style(i))
        left.set_ylabel(f"dev {record['metric']}")
    else:
        left.plot(lambdas, [p["changed"] for p in curve["argmax"]], marker="o",
                  label="argmax ≠ greedy", **line_style(0))  # fmt: skip
        left.set_ylabel("share of inputs (no gold outputs)")
    left.set(xlabel="λ", title=f"{record['task']}: reranking {curve['inputs']} inputs")
    left.legend(fontsize=8)
    table = record["fields"]["table"]
    names = [n for n in table if n != ALL] + [ALL] if table else []
    width = 0.27
    for i, (label, pick) in enumerate(
        (
            ("direct", lambda row: row["direct"]),
            ("reverse", lambda row: row["reverse"]),
            (f"combined λ={lam:g}", lambda row: row["combined"][str(lam)]),
        )
    ):
        shares = [pick(table[n])["share"] or 0.0 for n in names]
        right.bar([x + (i - 1) * width for x in range(len(names))], shares, width,
                  label=label, color=f"C{i}")  # fmt: skip
    reverse = [table[n]["reverse"] for n in names if table[n]["pairs"]]
    right.errorbar([x for x, n in enumerate(names) if table[n]["pairs"]],
                   [t["share"] for t in reverse],
                   yerr=[[t["share"] - t["interval"][0] for t in reverse],
                         [t["interval"][1] - t["share"] for t in reverse]],
                   fmt="none", ecolor="black", elinewidth=1, capsize=2)  # fmt: skip
    right.axhline(record["settings"]["blind_below"], color="grey", linestyle="--", linewidth=1)
    right.set_xticks(range(len(names)), [f"{n}\n({table[n]['pairs']})" for n in names], fontsize=8)
    right.set(
        ylim=(0, 1.2), ylabel="pairs where gold is preferred", title="which fields the reward sees"
    )
    right.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    if names:
        right.legend(fontsize=8, loc="upper center", ncol=3)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def write_report(out: Path, record: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    """Write the rows, the plot, the Markdown and, last, the JSON, their paths as run records
    name them (`runs.results.as_written`); returns the JSON's path."""
    from grammarrl.runs.atomic import write_jsonl
    from grammarrl.runs.paths import Roots, portable
    from grammarrl.runs.results import as_written

    record = as_written(record)
    write_jsonl(out / "diagnosis_rows.jsonl", portable(rows, Roots.of(record["config"])))
    plot(record, out / PLOT)
    atomic_write(out / MARKDOWN, lambda handle: handle.write(markdown(record)))
    return write_json(out / JSON, record)
