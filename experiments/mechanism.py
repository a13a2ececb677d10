"""Rewards of what each system emits, under the frozen reference (`eval.score_rewards`): mean
R_direct and R_reverse of its test outputs and the combined training reward they make at given
λ's under a training run's σ's. It separates "training did not raise the reward of greedy's
outputs" from "a higher reward does not give a higher score"."""

from __future__ import annotations

from collections.abc import Sequence

from experiments.runs import format_number, metric_label
from experiments.sigmas import Sigmas
from experiments.systems import MISSING, System, metric_of
from experiments.table_format import Block, Cell, Row, Table
from experiments.training_runs import TrainingRun
from grammarrl.rl.rloo import combine_rewards
from grammarrl.runs.results import mean_std


def mechanism_table(
    systems: Sequence[System],
    baseline: System,
    under_test: System,
    chosen: TrainingRun | None,
    sigmas: Sigmas | None,
    lambdas: Sequence[float],
    title: str,
) -> Table:
    """Per system with outputs of its own: its metric, mean R_direct and R_reverse of its
    outputs, and the combined reward at each λ (the chosen run's marked) under `sigmas`; a note
    sets `under_test` − `baseline` in score next to the same in combined reward."""
    metric = metric_of(systems)
    header = ["System", metric, "R_direct", "R_reverse"] + [
        f"combined, λ={format_number(lam)}" + (" (chosen)" if chosen and lam == chosen.lam else "")
        for lam in lambdas
    ]
    rows = [
        Row(row.label, _reward_cells(row, len(header) - 1, lambdas, sigmas))
        for row in systems
        if not row.paired_selection
    ]
    basis = _sigma_basis(under_test, chosen, sigmas)
    table = Table(
        "mechanism",
        f"{title}, rewards of each system's test outputs under the frozen reference: mean "
        "R_direct and R_reverse over a set's outputs with tokens, then mean ± std over test "
        "sets; combined = (1-λ) R_direct/σ_direct + λ R_reverse/σ_reverse with "
        + basis
        + ". The paired IS selection is not listed: its outputs were not scored.",
        header,
        [Block(rows)],
        best=None,
    )
    table.notes.extend(_notes(baseline, under_test, lambdas, sigmas))
    return table


def _reward_cells(
    row: System, width: int, lambdas: Sequence[float], sigmas: Sigmas | None
) -> list[Cell]:
    """A system's `width` cells: its metric, R_direct, R_reverse, then the combined reward at
    each λ (blank without σ's)."""
    if not row.present:
        return [Cell(text=MISSING)] + [Cell() for _ in range(width - 1)]
    cells = [Cell(*mean_std(row.scores))]
    rewards = row.rewards()
    if rewards is None:
        return cells + [Cell(text="not scored")] + [Cell() for _ in range(width - 2)]
    cells += [Cell(*mean_std([d for d, _ in rewards])), Cell(*mean_std([r for _, r in rewards]))]
    for lam in lambdas:
        if sigmas is None:
            cells.append(Cell())
            continue
        combined = [combine_rewards(d, r, lam, sigmas.direct, sigmas.reverse) for d, r in rewards]
        cells.append(Cell(*mean_std(combined)))
    return cells


def _sigma_basis(under_test: System, chosen: TrainingRun | None, sigmas: Sigmas | None) -> str:
    """Whose σ's combine the rewards, for the table's caption."""
    if sigmas is None:
        if chosen is None:
            return "no σ's: no training run has finished, and no evaluated adapter's run sets them"
        return f"no σ's found for the chosen run {chosen.run.path}"
    owner = (
        f"the chosen run's (N={chosen.n}, B={chosen.greedy.beam_width}) calibration"
        if chosen is not None
        else f"{under_test.label}'s run"
    )
    return (
        f"the σ's of {owner}, σ_direct={sigmas.direct:.4f}, σ_reverse={sigmas.reverse:.4f} "
        f"({sigmas.source})"
    )


def _notes(
    baseline: System, under_test: System, lambdas: Sequence[float], sigmas: Sigmas | None
) -> list[str]:
    """`under_test` − `baseline`: the change in reward next to the change in score."""
    ours, theirs = under_test.rewards(), baseline.rewards()
    if sigmas is None or ours is None or theirs is None:
        return []
    gain = mean_std(under_test.scores)[0] - mean_std(baseline.scores)[0]
    parts = [f"{metric_label(under_test.evaluation.metric)} {gain:+.3f}"]
    for lam in lambdas:
        gain = [
            combine_rewards(d, r, lam, sigmas.direct, sigmas.reverse)
            - combine_rewards(d0, r0, lam, sigmas.direct, sigmas.reverse)
            for (d, r), (d0, r0) in zip(ours, theirs)
        ]
        parts.append(f"combined reward at λ={format_number(lam)} {mean_std(gain)[0]:+.3f}")
    return [
        f"{under_test.label} minus {baseline.label} (mean over test sets): "
        + ", ".join(parts)
        + "."
    ]
