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


def _tally(tally: dict[str, Any], pairs: int) -> str:
    if not pairs:
        return "–"
    return f"{tally['gold_preferred']}/{pairs} ({tally['share']:.0%})"


def curve_table(record: dict[str, Any]) -> list[str]:
    """The metric of greedy, oracle and the argmax per λ, with the per-field F1's."""
    curve, metric = record["candidates"], record["metric"]
    fields = [f for f in curve["greedy"]["fields"] if f != "micro"]
    head = f"| | {metric} | {' | '.join(fields)}{' | ' if fields else ''}argmax ≠ greedy | reward gap (σ units) |"
    lines = [head, "|---|" + ":-:|" * (len(fields) + 3)]

    def row(name: str, measured: dict[str, Any], changed: str, gap: str) -> str:
        cells = [_number(measured["value"]), *(_number(measured["fields"].get(f)) for f in fields)]
        return f"| {name} | {' | '.join(cells)} | {changed} | {gap} |"

    lines.append(row("greedy", curve["greedy"], "–", "–"))
    lines.append(row("oracle (best candidate per input)", curve["oracle"], "–", "–"))
    chosen = record["verdict"]["recommended_lambda"]
    for point in curve["argmax"]:
        name = f"reward argmax, λ={point['lambda']:g}"
        name = f"**{name}** (recommended)" if point["lambda"] == chosen else name
        lines.append(
            row(name, point["metric"], f"{point['changed']:.0%}", _number(point["reward_gap"], 2))
        )
    return lines


def fields_table(record: dict[str, Any]) -> list[str]:
    """Per field: the pairs, and the share of them each reward prefers gold in."""
    table, lambdas = record["fields"]["table"], record["settings"]["lambdas"]
    head = "| field | pairs | direct | reverse | " + " | ".join(
        f"combined λ={lam:g}" for lam in lambdas
    )
    lines = [head + " | perturbations |", "|---|" + ":-:|" * (len(lambdas) + 3) + "---|"]
    for name, row in table.items():
        cells = [
            _tally(row["direct"], row["pairs"]),
            _tally(row["reverse"], row["pairs"]),
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
        "## Which fields the reward can see",
        "",
    ]
    fields = record["fields"]
    if fields["table"]:
        lines += [
            (
                f"{fields['labelled']} labelled rows ({fields['rows']}); each gold output next to "
                f"{fields['how']}: the share of pairs in which each reward scores the gold output "
                "higher. Where the reverse reward (the term that reads the input) prefers gold in fewer "
                f"than {settings['blind_below']:.0%} of a field's pairs (diagnose.blind_below), the "
                "reward cannot see the field: training moves it at random, or away from gold."
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
            f"lambdas={settings['lambdas']}, seed={settings['seed']}; the config's λ is "
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
    gold in (combined at the recommended λ)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    curve, lam = record["candidates"], record["verdict"]["recommended_lambda"]
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
    """Write the rows, the plot, the Markdown and, last, the JSON; returns the JSON's path."""
    from grammarrl.runs.atomic import write_jsonl

    write_jsonl(out / "diagnosis_rows.jsonl", rows)
    plot(record, out / PLOT)
    atomic_write(out / MARKDOWN, lambda handle: handle.write(markdown(record)))
    return write_json(out / JSON, record)
