"""Evidence II's systems (the rows compared on the test sets, with the frozen reference's
rewards of their outputs) and the mechanism table built from those rewards: did training raise
the reward of greedy's outputs, and did a higher reward give a higher score?"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiments.evidence_sigmas import Sigmas
from experiments.evidence_training import TrainingRun, metric_label
from experiments.runs import Evaluation, format_number
from experiments.table_format import Block, Cell, Row, Table
from grammarrl.rl.rloo import combine_rewards
from grammarrl.runs.results import mean_std

REFERENCE_LAMBDA = 0.5  # the paper's default λ: a fixed GrammarRL row and a combined-reward column
MISSING = "missing"


@dataclass(frozen=True)
class System:
    """One row of the comparison: the evaluation behind it (the Sample-Rerank run's, for the
    paired IS selection read from it) and its per-set scores; None when missing."""

    label: str
    evaluation: Evaluation | None
    scores: tuple[float, ...] | None = None
    role: str = ""  # greedy, rerank, is (paired selection), chosen: the rows others refer to

    @property
    def present(self) -> bool:
        return self.scores is not None

    @property
    def paired_selection(self) -> bool:
        """A selection on another method's particles (Full IS on the rerank particles): its
        outputs were not scored."""
        return self.role == "is"

    def rewards(self) -> list[tuple[float, float]] | None:
        """Per test set (mean R_direct, mean R_reverse) of its outputs; None when not scored."""
        if self.evaluation is None or self.paired_selection:
            return None
        values = [
            (s.get("reward_direct"), s.get("reward_reverse"))
            for s in self.evaluation.results.get("per_set") or []
        ]
        if not values or not all(_finite(d) and _finite(r) for d, r in values):
            return None
        return [(float(d), float(r)) for d, r in values]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def system(label: str, ev: Evaluation | None, role: str = "") -> System:
    return System(label, ev, tuple(ev.scores) if ev else None, role)


def by_role(systems: Sequence[System], role: str) -> System:
    return next(row for row in systems if row.role == role)


# --- rewards of what each system emits ----------------------------------------------------------


def mechanism_table(
    systems: Sequence[System], chosen: TrainingRun | None, sigmas: Sigmas | None
) -> Table:
    """Per scored system: its metric, mean R_direct and R_reverse of its outputs, and the
    combined reward at λ=0.5 and at the chosen λ under the chosen run's σ's (without training
    runs: at λ=0.5, under the σ's of the evaluated adapter's run)."""
    lambdas = [REFERENCE_LAMBDA]
    if chosen is not None and abs(chosen.lam - REFERENCE_LAMBDA) > 1e-9:
        lambdas.append(chosen.lam)
    metric = metric_label(next((r.evaluation.metric for r in systems if r.evaluation), "metric"))
    header = ["System", metric, "R_direct", "R_reverse"] + [
        f"combined, λ={format_number(lam)}" + (" (chosen)" if chosen and lam == chosen.lam else "")
        for lam in lambdas
    ]
    rows = [
        Row(row.label, _reward_cells(row, len(header) - 1, lambdas, sigmas))
        for row in systems
        if not row.paired_selection
    ]
    basis = _sigma_basis(systems, chosen, sigmas)
    table = Table(
        "mechanism",
        "Evidence II, rewards of each system's test outputs under the frozen reference: mean "
        "R_direct and R_reverse over a set's outputs with tokens, then mean ± std over test "
        "sets; combined = (1-λ) R_direct/σ_direct + λ R_reverse/σ_reverse with "
        + basis
        + ". The paired IS selection is not listed: its outputs were not scored.",
        header,
        [Block(rows)],
        best=None,
    )
    table.notes.extend(_mechanism_notes(systems, lambdas, sigmas))
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


def _sigma_basis(
    systems: Sequence[System], chosen: TrainingRun | None, sigmas: Sigmas | None
) -> str:
    """Whose σ's combine the rewards, for the table's caption."""
    if sigmas is None:
        if chosen is None:
            return "no σ's: no training run has finished, and no evaluated adapter's run sets them"
        return f"no σ's found for the chosen run {chosen.run.path}"
    owner = (
        f"the chosen run's (N={chosen.n}, B={chosen.greedy.beam_width}) calibration"
        if chosen is not None
        else f"{by_role(systems, 'chosen').label}'s run"
    )
    return (
        f"the σ's of {owner}, σ_direct={sigmas.direct:.4f}, σ_reverse={sigmas.reverse:.4f} "
        f"({sigmas.source})"
    )


def _mechanism_notes(
    systems: Sequence[System], lambdas: Sequence[float], sigmas: Sigmas | None
) -> list[str]:
    """GrammarRL (dev-chosen) − frozen greedy: the change in reward next to the change in F1."""
    greedy, trained = by_role(systems, "greedy"), by_role(systems, "chosen")
    ours, theirs = trained.rewards(), greedy.rewards()
    if sigmas is None or ours is None or theirs is None:
        return []
    gain = mean_std(trained.scores)[0] - mean_std(greedy.scores)[0]
    parts = [f"{metric_label(trained.evaluation.metric)} {gain:+.3f}"]
    for lam in lambdas:
        gain = [
            combine_rewards(d, r, lam, sigmas.direct, sigmas.reverse)
            - combine_rewards(d0, r0, lam, sigmas.direct, sigmas.reverse)
            for (d, r), (d0, r0) in zip(ours, theirs)
        ]
        parts.append(f"combined reward at λ={format_number(lam)} {mean_std(gain)[0]:+.3f}")
    return [f"{trained.label} minus frozen greedy (mean over test sets): " + ", ".join(parts) + "."]
